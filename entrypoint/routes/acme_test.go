package routes

import (
	"slices"
	"testing"
)

func TestHostsAreReportedOnceHAProxyRunsTheRendering(t *testing.T) {
	var got [][]string
	r := mustNew(t, Options{HTTPBind: "127.0.0.1:18080", HTTPSBind: "127.0.0.1:18443", CrtList: goldenCrtList,
		ACMEMap: goldenACMEMap, Hosts: func(h []string) { got = append(got, h) }})
	out, err := r.Render(catalog(
		inst("shop", "shop-1", "10.0.0.1", 8080, "seamless.http.host=shop.example", "seamless.http.path=/"),
		inst("api", "api-1", "10.0.0.2", 8080, "seamless.http.host=shop.example", "seamless.http.path=/api"),
		inst("blog", "blog-1", "10.0.0.3", 8080, "seamless.http.host=blog.example"),
		// A wildcard cannot be proved over HTTP-01, and any host is no host.
		inst("wild", "wild-1", "10.0.0.4", 8080, "seamless.http.host=*.wild.example"),
		inst("all", "all-1", "10.0.0.5", 8080, "seamless.http.path=/"),
	))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("hosts reported before HAProxy runs the rendering: %v", got)
	}
	out.Commit()
	if want := []string{"blog.example", "shop.example"}; len(got) != 1 || !slices.Equal(got[0], want) {
		t.Fatalf("hosts = %v, want one report of %v", got, want)
	}
}
