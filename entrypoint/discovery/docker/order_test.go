package docker

import (
	"testing"
	"time"
)

// A container's creation time orders the registrations: the earliest keeps
// a route two services claim (issue 10, item 2).
func TestCreatedIsTheRegistrationOrder(t *testing.T) {
	older, newer := inspected(), inspected()
	older.Created = "2026-01-02T03:04:05.000000001Z"
	newer.Created = "2026-01-02T03:04:05.5Z"
	a := convert(older, "", nil, time.Now()).instance
	b := convert(newer, "", nil, time.Now()).instance
	if a == nil || b == nil {
		t.Fatal("not converted")
	}
	if a.Registered == 0 || a.Registered >= b.Registered {
		t.Fatalf("Registered = %d and %d; want the older container first", a.Registered, b.Registered)
	}
	unknown := inspected()
	unknown.Created = "not a time"
	if in := convert(unknown, "", nil, time.Now()).instance; in == nil || in.Registered != 0 {
		t.Fatalf("an unreadable creation time: %+v, want Registered 0 (unknown)", in)
	}
}
