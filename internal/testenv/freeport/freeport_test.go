package freeport

import "testing"

// A port handed out is locked for every other holder of its file, as it
// is for another test process: a second claim of it fails.
func TestAHandedOutPortIsClaimedForOtherProcesses(t *testing.T) {
	ports, err := Get(3)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		if claim(p) {
			t.Errorf("port %d was claimed again after Get handed it out", p)
		}
	}
}
