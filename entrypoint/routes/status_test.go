package routes

import (
	"slices"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// The rendering lists the routes for /status, in HAProxy's order.
func TestRenderingListsItsRoutes(t *testing.T) {
	r := mustNew(t, goldenOpts)
	c := model.Catalog{Instances: []model.Instance{
		{Source: "file", Name: "web", ID: "w1", Address: "10.0.0.1", Port: 80, Status: model.StatusPassing, Tags: []string{"seamless.http.host=web.example"}},
		{Source: "file", Name: "api", ID: "a1", Address: "10.0.0.2", Port: 80, Status: model.StatusPassing, Tags: []string{"seamless.http.host=web.example", "seamless.http.path=/api"}},
		{Source: "file", Name: "db", ID: "d1", Address: "10.0.0.3", Port: 5432, Status: model.StatusPassing, Tags: []string{"seamless.tcp.port=15432"}},
	}}
	out, err := r.Render(model.Merge(map[string]model.Snapshot{"file": {Source: "file", Results: map[model.Query]model.Result{model.LocalCatalog: {Catalog: &c}}}}, []string{"file"}))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, rt := range out.Routes {
		got = append(got, rt.Match+" → "+rt.Service+" ("+rt.Backend+")")
	}
	want := []string{
		"host web.example path /api → api (http-api)",
		"host web.example path / → web (http-web)",
		"tcp port 15432 → db (tcp-db)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("routes\n%q\nwant\n%q", got, want)
	}
}
