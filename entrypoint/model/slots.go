package model

// Slots are a rendering's server slots, backend by backend in the
// configuration's order. A rendering shares the list of every backend
// whose slots did not change with the rendering before it, so that one
// change allocates one backend's slots, not every backend's: never write
// a list Backends returns. Two lists of a backend that are the same slice
// hold the same slots.
type Slots struct {
	backends [][]ServerSlot // each non-empty, all of one backend
	n        int
}

// SlotsOf groups slots, listed backend by backend, into Slots; it keeps
// the backing array of slots.
func SlotsOf(slots []ServerSlot) Slots {
	var s Slots
	for i := 0; i < len(slots); {
		j := i + 1
		for j < len(slots) && slots[j].Backend == slots[i].Backend {
			j++
		}
		s.backends = append(s.backends, slots[i:j:j])
		i = j
	}
	s.n = len(slots)
	return s
}

// SlotsByBackend makes Slots of lists of one backend each, kept as they
// are; empty lists are left out. It takes backends: write it no more.
func SlotsByBackend(backends [][]ServerSlot) Slots {
	s := Slots{backends: backends[:0]}
	for _, b := range backends {
		if len(b) > 0 {
			s.backends = append(s.backends, b)
			s.n += len(b)
		}
	}
	return s
}

// Len is the number of slots.
func (s Slots) Len() int { return s.n }

// Backends lists the slots of each backend; read only.
func (s Slots) Backends() [][]ServerSlot { return s.backends }

// Flat copies every slot into one list, in order.
func (s Slots) Flat() []ServerSlot {
	if s.n == 0 {
		return nil
	}
	out := make([]ServerSlot, 0, s.n)
	for _, b := range s.backends {
		out = append(out, b...)
	}
	return out
}

// SameSlots reports whether a and b are the same list (not a copy): what
// lets a reader skip a backend that did not change.
func SameSlots(a, b []ServerSlot) bool { return SameList(a, b) }
