package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/config"
)

// health asks a running seamless's /healthz, for the image's HEALTHCHECK:
// the HAProxy images carry no HTTP client.
func health(ctx context.Context, cfg *config.Config, stdout, stderr io.Writer) int {
	if cfg.StatusAddr == "" {
		fmt.Fprintln(stderr, "seamless health: SEAMLESS_STATUS_ADDR is empty, nothing to ask")
		return exitUsage
	}
	host, port, _ := net.SplitHostPort(cfg.StatusAddr) // validated by config.Load
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/healthz", nil)
	if err != nil {
		fmt.Fprintf(stderr, "seamless health: %v\n", err)
		return exitInvalid
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "seamless health: %v\n", err)
		return exitInvalid
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Fprintf(stdout, "%d %s\n", resp.StatusCode, strings.TrimSpace(string(body)))
	if resp.StatusCode != http.StatusOK {
		return exitInvalid
	}
	return 0
}
