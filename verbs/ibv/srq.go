package ibv

// SRQAttr sizes and arms a shared receive queue (ibv_srq_attr).
type SRQAttr struct {
	// MaxWR is the queue's depth: at most this many receives posted and
	// not yet taken by an arriving message.
	MaxWR int
	// MaxSGE is the most SGEs a receive may have (MaxSGE; Query reports
	// it, create and modify ignore it).
	MaxSGE int
	// Limit, when not 0, arms the limit event: once the count of posted
	// receives drops below it, the SRQ emits EventSRQLimitReached and
	// disarms (Limit reads 0 again), as IBV_EVENT_SRQ_LIMIT_REACHED.
	Limit int
}

// SRQAttrMask says which fields of an SRQAttr a modify changes
// (ibv_srq_attr_mask).
type SRQAttrMask int

// SRQ attribute mask bits, libibverbs' values.
const (
	// SRQMaxWR resizes the queue (IBV_SRQ_MAX_WR).
	SRQMaxWR SRQAttrMask = 1 << 0
	// SRQLimit arms (or, with 0, disarms) the limit event (IBV_SRQ_LIMIT).
	SRQLimit SRQAttrMask = 1 << 1
)
