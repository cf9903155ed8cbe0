package supervisor

import (
	"slices"
	"testing"
)

func TestHAProxyEnvWithholdsSecrets(t *testing.T) {
	in := []string{"PATH=/bin", "CONSUL_HTTP_TOKEN=s", "CONSUL_HTTP_TOKEN_FILE=/t", "DOCKER_HOST=tcp://x",
		"SEAMLESS_STATUS_ADDR=:1", "HAPROXY_MWORKER=1", "MY_CONSUL_ADDR=kept", "HAPROXY_CLIENT_TIMEOUT=5s"}
	want := []string{"PATH=/bin", "MY_CONSUL_ADDR=kept", "HAPROXY_CLIENT_TIMEOUT=5s"}
	if got := HAProxyEnv(in); !slices.Equal(got, want) {
		t.Errorf("HAProxyEnv = %q, want %q", got, want)
	}
}
