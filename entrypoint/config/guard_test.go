package config

import (
	"strings"
	"testing"
	"time"
)

func TestRemovalGuardVariables(t *testing.T) {
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if c.RemovalGuard != 50 || c.RemovalHold != 30*time.Second {
		t.Errorf("defaults: guard %d%%, hold %s; want 50%%, 30s", c.RemovalGuard, c.RemovalHold)
	}
	for _, tt := range []struct{ key, value, want string }{
		{"SEAMLESS_REMOVAL_GUARD", "101", "SEAMLESS_REMOVAL_GUARD: 101 is outside 0–100"},
		{"SEAMLESS_REMOVAL_GUARD", "-1", "SEAMLESS_REMOVAL_GUARD: -1 is outside 0–100"},
		{"SEAMLESS_REMOVAL_HOLD", "500ms", "SEAMLESS_REMOVAL_HOLD: 500ms is outside 1s–1h"},
		{"SEAMLESS_REMOVAL_HOLD", "2h", "SEAMLESS_REMOVAL_HOLD: 2h0m0s is outside 1s–1h"},
	} {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			t.Setenv(tt.key, tt.value)
			_, err := Load()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want %q", err, tt.want)
			}
		})
	}
	t.Run("0 disables the guard, whatever the hold", func(t *testing.T) {
		t.Setenv("SEAMLESS_REMOVAL_GUARD", "0")
		if c, err := Load(); err != nil || c.RemovalGuard != 0 {
			t.Errorf("%+v, %v", c, err)
		}
	})
}
