package procfs

import (
	"os"
	"os/exec"
	"testing"
)

func TestOwnTree(t *testing.T) {
	self, ok := Stat(os.Getpid())
	if !ok || self.Pid != os.Getpid() || self.PPid != os.Getppid() || self.Zombie() {
		t.Fatalf("Stat(self) = %+v, %v", self, ok)
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	found := false
	for _, p := range Descendants(os.Getpid()) {
		found = found || (p.Pid == cmd.Process.Pid && p.Name == "sleep")
	}
	if !found {
		t.Errorf("the child sleep is not among the descendants")
	}
	if !Mentions(cmd.Process.Pid, "sleep") || Mentions(cmd.Process.Pid, "no-such-marker") {
		t.Error("Mentions does not read the command line")
	}
	if _, ok := Stat(-1); ok {
		t.Error("a process that cannot exist was found")
	}
}
