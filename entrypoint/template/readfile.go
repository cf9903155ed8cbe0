package template

import (
	"errors"
	"fmt"

	"github.com/seamless-lb/seamless/internal/regular"
)

// readRegular reads a regular file. Anything else is refused without
// reading: a FIFO would block the render, and the apply loop with it, until
// a writer comes; a device may never end.
func readRegular(path string) ([]byte, error) {
	b, err := regular.ReadFile(path)
	if re := (*regular.Error)(nil); errors.As(err, &re) {
		return nil, fmt.Errorf("%w: reading it could block rendering for ever; use a file", err)
	}
	return b, err
}
