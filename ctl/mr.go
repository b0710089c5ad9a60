package ctl

// MR is a registered memory region as the engine's region table holds it
// (like `rdma resource show mr`).
type MR struct {
	// STag is its steering tag (lkey and rkey).
	STag uint32 `json:"stag"`
	// PDN is its protection domain.
	PDN uint32 `json:"pdn"`
	// Addr and Len are its bounds: the tagged offset of its first byte and
	// its length in bytes.
	Addr uint64 `json:"addr"`
	Len  int    `json:"len"`
	// Access are its access rights ("LOCAL_WRITE|REMOTE_WRITE").
	Access string `json:"access"`
}

// MRs asks for the device's registered memory regions.
func (c *Client) MRs() ([]MR, error) {
	resp, err := c.Call(Request{Op: OpMR})
	if err != nil {
		return nil, err
	}
	return resp.MRs, nil
}
