package apply

import (
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

func inst(name, id, addr, status string) model.Instance {
	return model.Instance{Name: name, ID: id, Address: addr, Port: 80, Status: status}
}

func TestChange(t *testing.T) {
	p := model.StatusPassing
	before := model.Catalog{Instances: []model.Instance{
		inst("web", "1", "10.0.0.1", p), inst("web", "2", "10.0.0.2", p), inst("old", "1", "10.0.1.1", p),
	}}
	for _, tc := range []struct {
		name  string
		after []model.Instance
		want  string
	}{
		{"nothing", before.Instances, "no service changed"},
		{"scale up and a new service", append(append([]model.Instance{}, before.Instances...),
			inst("web", "3", "10.0.0.3", p), inst("web", "4", "10.0.0.4", p), inst("api", "1", "10.0.2.1", p)),
			"api: new service (1 instance); web: +2 instances"},
		{"health and removal", []model.Instance{inst("web", "1", "10.0.0.1", model.StatusCritical)},
			"old: gone; web: -1 instance, 1 now critical"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Change(before, model.Catalog{Instances: tc.after}); got != tc.want {
				t.Errorf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}
