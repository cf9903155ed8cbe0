//go:build tools

// Package tools pins Pebble and its challenge test server as dependencies
// of this module, so that `go build` builds both commands.
package tools

import (
	_ "github.com/letsencrypt/pebble/v2/cmd/pebble"
	_ "github.com/letsencrypt/pebble/v2/cmd/pebble-challtestsrv"
)
