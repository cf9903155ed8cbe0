//go:build tools

// Package tools pins consul-template as a dependency of this module, so
// that `go build github.com/hashicorp/consul-template` builds it.
package tools

import _ "github.com/hashicorp/consul-template"
