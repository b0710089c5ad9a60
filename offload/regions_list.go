package offload

// List returns the valid memory regions (not the memory windows) in table
// order: the order they were registered in, a deregistered region's slot
// going to a later one (for the control plane; it allocates). STags are
// unpredictable (stag.go), so their numeric order means nothing.
func (t *Regions) List() []*Region {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []*Region
	for _, r := range t.slots {
		if r != nil && r.valid && r.mw == 0 {
			out = append(out, r)
		}
	}
	return out
}
