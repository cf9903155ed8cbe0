package model

import (
	"slices"
	"testing"
)

// SlotsOf groups a flat list by backend and keeps its array; Flat gives
// the list back.
func TestSlotsGroupByBackend(t *testing.T) {
	flat := []ServerSlot{{Backend: "a", Server: "s1"}, {Backend: "a", Server: "s2"}, {Backend: "b", Server: "s1"}}
	s := SlotsOf(flat)
	if s.Len() != 3 || len(s.Backends()) != 2 || len(s.Backends()[0]) != 2 || len(s.Backends()[1]) != 1 {
		t.Fatalf("grouped as %v", s.Backends())
	}
	if !SameSlots(s.Backends()[1], flat[2:]) {
		t.Error("a backend's list is a copy of the flat list's")
	}
	if !slices.Equal(s.Flat(), flat) || SlotsOf(nil).Flat() != nil {
		t.Errorf("Flat = %v", s.Flat())
	}
	if SameSlots(flat[:1], slices.Clone(flat[:1])) {
		t.Error("a copy counts as the same list")
	}
	if by := SlotsByBackend([][]ServerSlot{flat[:2], nil, flat[2:]}); by.Len() != 3 || len(by.Backends()) != 2 {
		t.Errorf("SlotsByBackend kept %d lists of %d slots, want 2 of 3", len(by.Backends()), by.Len())
	}
}
