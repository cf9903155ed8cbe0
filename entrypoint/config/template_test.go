package config

import (
	"strings"
	"testing"
)

func TestTemplateDelimiters(t *testing.T) {
	tests := []struct{ value, left, right, err string }{
		{"", "", "", ""},
		{"[[ ]]", "[[", "]]", ""},
		{"  <%  %>  ", "<%", "%>", ""},
		{"[[", "", "", "two delimiters"},
		{"[[ ]] x", "", "", "two delimiters"},
		{"|| ||", "", "", "must differ"},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			t.Setenv("SEAMLESS_TEMPLATE_DELIMITERS", tt.value)
			c, err := Load()
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), "SEAMLESS_TEMPLATE_DELIMITERS") || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one naming SEAMLESS_TEMPLATE_DELIMITERS and %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if l, r, _ := c.Delims(); l != tt.left || r != tt.right {
				t.Errorf("Delims() = %q %q, want %q %q", l, r, tt.left, tt.right)
			}
		})
	}
}
