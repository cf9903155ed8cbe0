package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// sourcesReady is /readyz in discovery mode: the applier's readiness,
// with a source whose reads fail named as a degradation. A Consul agent
// cut off from its servers answers errors at once, but the source only
// becomes stale after a blocking query's wait plus a margin (over a
// minute); until then /readyz would say a plain "ok" while nothing new
// arrives. Still ready (200): the last good data keeps serving.
func sourcesReady(ready func() error, statuses func() []model.SourceStatus) func() error {
	return func() error {
		err := ready()
		var degraded *model.Degraded
		if err != nil && !errors.As(err, &degraded) {
			return err // not ready: that says more
		}
		var failing []string
		for _, st := range statuses() {
			// A stale source is named by ready already.
			if !st.Up && !st.Stale && st.LastError != "" {
				failing = append(failing, fmt.Sprintf("source %s fails: %s", st.Name, st.LastError))
			}
		}
		if len(failing) == 0 {
			return err
		}
		reason := strings.Join(failing, "; ") + "; its last good data keeps serving"
		if degraded != nil {
			reason = degraded.Reason + "; " + reason
		}
		return &model.Degraded{Reason: reason}
	}
}
