package haproxy

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestLogTap(t *testing.T) {
	tap := NewLogTap()
	var transfer []string
	tap.OnSocketTransferFailure = func(l string) { transfer = append(transfer, l) }
	var out bytes.Buffer
	tap.Copy(strings.NewReader("[NOTICE]   (1) : Loading success.\n"), &out)
	mark := tap.Mark()
	in := "[NOTICE]   (1) : Reloading HAProxy\n" +
		"[ALERT]    (1) : Binding [h.cfg:11] for frontend fe: cannot bind socket\n" +
		"127.0.0.1:1234 traffic log line\n" +
		"[WARNING]  (1) : Loading failure!\n" +
		"[WARNING]  (9) : Failed to get the sockets from the old process!\n" +
		"no newline at the end"
	tap.Copy(strings.NewReader(in), &out)

	if out.String() != "[NOTICE]   (1) : Loading success.\n"+in {
		t.Errorf("output was not copied verbatim:\n%s", out.String())
	}
	if got := tap.Since(mark); len(got) != 6 || got[5] != "no newline at the end" {
		t.Errorf("Since(mark) = %q", got)
	}
	want := []string{
		"[ALERT]    (1) : Binding [h.cfg:11] for frontend fe: cannot bind socket",
		"[WARNING]  (1) : Loading failure!",
	}
	if got := tap.Startup(mark); !reflect.DeepEqual(got, want) {
		t.Errorf("Startup = %q, want %q", got, want)
	}
	if len(transfer) != 1 {
		t.Errorf("socket transfer failures seen: %q, want one", transfer)
	}
}

func TestLogTapKeepsOnlyRecentLines(t *testing.T) {
	tap := NewLogTap()
	var in strings.Builder
	for i := range tapKeep * 3 {
		fmt.Fprintf(&in, "%d\n", i)
	}
	tap.Copy(strings.NewReader(in.String()), &bytes.Buffer{})
	got := tap.Since(0)
	if len(got) != tapKeep || got[0] != fmt.Sprint(tapKeep*2) || got[tapKeep-1] != fmt.Sprint(tapKeep*3-1) {
		t.Errorf("kept %d lines, %q..%q; want the last %d", len(got), got[0], got[len(got)-1], tapKeep)
	}
	if got := tap.Since(tap.Mark() - 2); len(got) != 2 || got[1] != fmt.Sprint(tapKeep*3-1) {
		t.Errorf("Since(mark-2) = %q", got)
	}
}
