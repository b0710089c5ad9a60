package offload

import "sort"

// List returns the valid regions in STag order (for the control plane;
// it allocates).
func (t *Regions) List() []*Region {
	t.mu.RLock()
	var out []*Region
	for _, r := range t.slots {
		if r != nil && r.valid {
			out = append(out, r)
		}
	}
	t.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].stag < out[j].stag })
	return out
}
