package consulproc

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/internal/testenv"
)

// TestAnAgentDiesWithItsStarter: a benchmark or test killed outright (a
// timeout's panic runs no cleanup) must not leave its Consul agent
// running, holding ports and CPU for whatever runs next on the machine.
func TestAnAgentDiesWithItsStarter(t *testing.T) {
	if os.Getenv("SEAMLESS_CONSULPROC_CHILD") != "" {
		a, err := Start(context.Background(), Options{Bin: testenv.ConsulBin(t), Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("agent %d\n", a.Pid())
		time.Sleep(time.Minute) // killed long before
		a.Stop()
		return
	}
	testenv.ConsulBin(t) // skipped without one
	child := exec.Command(os.Args[0], "-test.run=^TestAnAgentDiesWithItsStarter$", "-test.v")
	child.Env = append(os.Environ(), "SEAMLESS_CONSULPROC_CHILD=1")
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	pids := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), "agent "); ok {
				if pid, err := strconv.Atoi(s); err == nil {
					pids <- pid
				}
			}
		}
	}()
	var pid int
	select {
	case pid = <-pids:
	case <-time.After(90 * time.Second):
		t.Fatal("the child started no agent")
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	gone := func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		// A zombie waiting for init to reap it has exited too.
		return err != nil || strings.Contains(string(b), ") Z ")
	}
	t.Cleanup(func() {
		if !gone() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	testenv.Eventually(t, 15*time.Second, "the agent exited with the process that started it", gone)
}
