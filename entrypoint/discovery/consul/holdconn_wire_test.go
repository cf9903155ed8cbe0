package consul

import (
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// leaderStub answers Consul's leader query, and says which protocol
// asked.
func leaderStub(protos chan<- string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		select {
		case protos <- r.Proto:
		default:
		}
		fmt.Fprint(w, `"127.0.0.1:8300"`)
	}
}

// The source's client reaches its agent the ways Consul's own variables
// name it: a unix socket, on held connections of HTTP/1.1; TLS checked
// against CONSUL_CACERT (an https:// address or CONSUL_HTTP_SSL) on
// HTTP/2, which Consul's HTTPS listener speaks, so that the held queries
// share a connection.
func TestHeldConnReachesTheAgentAsConsulsVariablesSay(t *testing.T) {
	protos := make(chan string, 1)
	tlsSrv := httptest.NewUnstartedServer(leaderStub(protos))
	tlsSrv.EnableHTTP2 = true
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "consul.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	unixSrv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: leaderStub(protos)}}
	unixSrv.Start()
	t.Cleanup(unixSrv.Close)
	tlsAddr := strings.TrimPrefix(tlsSrv.URL, "https://")

	tests := []struct {
		name  string
		env   map[string]string
		proto string
		fail  string // in the error, if it must fail
	}{
		{"https address", map[string]string{"CONSUL_HTTP_ADDR": "https://" + tlsAddr, "CONSUL_CACERT": ca}, "HTTP/2.0", ""},
		{"CONSUL_HTTP_SSL", map[string]string{"CONSUL_HTTP_ADDR": tlsAddr, "CONSUL_HTTP_SSL": "true", "CONSUL_CACERT": ca}, "HTTP/2.0", ""},
		{"a CA that did not sign", map[string]string{"CONSUL_HTTP_ADDR": "https://" + tlsAddr}, "", "certificate"},
		{"unix socket", map[string]string{"CONSUL_HTTP_ADDR": "unix://" + sock}, "HTTP/1.1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{"CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL", "CONSUL_CACERT", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE"} {
				t.Setenv(k, tt.env[k])
			}
			src, err := New(Config{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			leader, err := src.client.Status().Leader()
			if tt.fail != "" {
				if err == nil || !strings.Contains(err.Error(), tt.fail) {
					t.Fatalf("leader: %q, err %v; want an error about the %s", leader, err, tt.fail)
				}
				return
			}
			if err != nil || leader != "127.0.0.1:8300" {
				t.Fatalf("leader: %q, err %v", leader, err)
			}
			if proto := <-protos; proto != tt.proto {
				t.Errorf("asked over %s, want %s", proto, tt.proto)
			}
		})
	}
}
