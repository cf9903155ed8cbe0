package testenv

import "testing"

// The allocator never hands out a port twice, so that two ports a test
// asks for (Consul's HTTP and Serf ports) can never be the same.
func TestFreePortNeverRepeats(t *testing.T) {
	seen := map[int]int{}
	for i := range 3000 {
		p := FreePort(t)
		if j, dup := seen[p]; dup {
			t.Fatalf("call %d returned port %d, as call %d did", i, p, j)
		}
		seen[p] = i
	}
}

// Ports asked for together are distinct too, and were bound when chosen.
func TestFreePortsAreDistinct(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		for _, p := range FreePorts(t, 5) {
			if seen[p] {
				t.Fatalf("port %d handed out twice", p)
			}
			seen[p] = true
		}
	}
}

func TestCI(t *testing.T) {
	for v, want := range map[string]bool{"": false, "0": false, "false": false, "FALSE": false, "true": true, "1": true, "yes": true} {
		t.Setenv("CI", v)
		if got := CI(); got != want {
			t.Errorf("CI=%q: CI() = %v, want %v", v, got, want)
		}
	}
}
