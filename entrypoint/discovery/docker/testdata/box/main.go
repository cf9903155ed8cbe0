// Command box is the process of the docker source's test containers, in an
// image FROM scratch: `box 8080 9090` answers "ok" on each TCP port until
// SIGTERM (and `box drain=5s 8080` goes on answering for 5s after it, as a
// draining server does); SIGHUP is ignored. `box exit N` exits with status
// N, for healthchecks.
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "exit" {
		code, err := strconv.Atoi(os.Args[2])
		if err != nil {
			code = 2
		}
		os.Exit(code)
	}
	// PID 1 ignores SIGTERM unless it handles it: handle it, so that
	// `docker stop` is immediate.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	signal.Ignore(syscall.SIGHUP)
	var (
		ports []string
		drain time.Duration
	)
	for _, a := range os.Args[1:] {
		if d, ok := strings.CutPrefix(a, "drain="); ok {
			drain, _ = time.ParseDuration(d)
			continue
		}
		ports = append(ports, a)
	}
	if len(ports) == 0 {
		ports = []string{"8080"}
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }),
		ReadHeaderTimeout: 5 * time.Second,
	}
	for _, p := range ports {
		l, err := net.Listen("tcp", ":"+p)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		go srv.Serve(l)
	}
	// Tests signal the box only after this line: before signal.Ignore
	// above, Go's runtime would exit on SIGHUP.
	fmt.Println("ready")
	<-ctx.Done()
	time.Sleep(drain) // the draining server's grace period, not synchronisation
	srv.Close()
}
