package template

import (
	"fmt"
	"maps"
	"slices"
)

// Scratch is a render's scratchpad (`scratch`): a fresh one for every
// render, never shared between renders or templates. A render runs on one
// goroutine, so it needs no lock.
type Scratch struct {
	values map[string]any
}

// Key reports whether k is set, even to nil.
func (s *Scratch) Key(k string) bool {
	_, ok := s.values[k]
	return ok
}

// Get returns the value at k, or nil.
func (s *Scratch) Get(k string) any { return s.values[k] }

// Set stores v at k, overwriting.
func (s *Scratch) Set(k string, v any) string {
	s.init()
	s.values[k] = v
	return ""
}

// SetX stores v at k unless k is already set.
func (s *Scratch) SetX(k string, v any) string {
	s.init()
	if _, ok := s.values[k]; !ok {
		s.values[k] = v
	}
	return ""
}

// MapSet stores v under mk in the map at k, overwriting.
func (s *Scratch) MapSet(k, mk string, v any) (string, error) { return s.mapSet(k, mk, v, true) }

// MapSetX stores v under mk in the map at k unless mk is already set.
func (s *Scratch) MapSetX(k, mk string, v any) (string, error) { return s.mapSet(k, mk, v, false) }

func (s *Scratch) mapSet(k, mk string, v any, overwrite bool) (string, error) {
	s.init()
	if _, ok := s.values[k]; !ok {
		s.values[k] = map[string]any{}
	}
	m, ok := s.values[k].(map[string]any)
	if !ok {
		return "", fmt.Errorf("%q is not a map", k)
	}
	if _, set := m[mk]; overwrite || !set {
		m[mk] = v
	}
	return "", nil
}

// MapValues returns the values of the map at k sorted by their keys; nil
// when k holds no map.
func (s *Scratch) MapValues(k string) ([]any, error) {
	m, ok := s.values[k].(map[string]any)
	if !ok {
		return nil, nil
	}
	out := make([]any, 0, len(m))
	for _, mk := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[mk])
	}
	return out, nil
}

// Values returns a copy of the whole scratchpad (a seamless addition;
// ranging over it visits keys in sorted order).
func (s *Scratch) Values() map[string]any { return maps.Clone(s.values) }

func (s *Scratch) init() {
	if s.values == nil {
		s.values = map[string]any{}
	}
}
