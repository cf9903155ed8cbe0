//go:build tools

// Package tools pins the Consul agent as a dependency of this module, so
// that `go build github.com/hashicorp/consul` builds it.
package tools

import _ "github.com/hashicorp/consul"
