package docker

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/routes"
)

// The labels mirror routes' tag schema, and the tags made from them are
// what routes reads: the contract between this source and the built-in
// configuration.
func TestTagsAreWhatRoutesReads(t *testing.T) {
	if LabelHTTPHost != routes.TagHTTPHost || LabelHTTPPath != routes.TagHTTPPath || LabelTCPPort != routes.TagTCPPort {
		t.Fatalf("the labels %s, %s, %s are not routes' tags", LabelHTTPHost, LabelHTTPPath, LabelTCPPort)
	}
	c := inspected("seamless.http.host=A.example, *.b.example", "seamless.http.path=/api/,/v2", "seamless.tcp.port=5432",
		"seamless.service=web", "seamless.port=8080", "seamless.weight=3", "seamless.http.hots=typo.example")
	r := convert(c, "", nil, time.Now())
	if r.instance == nil {
		t.Fatal(r.skip)
	}
	got, problems := routes.ParseTags(r.instance.Tags)
	want := routes.Tags{Hosts: []string{"a.example", "*.b.example"}, Paths: []string{"/api", "/v2"}, Ports: []int{5432}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("routes reads %+v, want %+v", got, want)
	}
	// The labels the source consumes are not tags routes would call
	// unknown; the typo is.
	if len(problems) != 1 || !strings.Contains(problems[0], "unknown tag seamless.http.hots") {
		t.Errorf("problems %q, want only the typo", problems)
	}
}
