package queue

import (
	"fmt"

	"github.com/outboxhq/outbox/envelope"
)

// Prepared is one envelope of an Enqueue call, checked: a private copy
// with its tenant set, its JSON encoding and the rows it materialises.
type Prepared struct {
	Env      *envelope.Envelope
	Line     []byte // the envelope's JSON encoding
	Segments int    // envelope.Rows
}

// Prepare checks every envelope of an Enqueue call, in order, as every
// store does before it looks anything up: the first one missing or invalid
// fails the call with an *EnqueueError wrapping envelope.ErrInvalid.
func Prepare(envs []*envelope.Envelope) ([]Prepared, error) {
	out := make([]Prepared, len(envs))
	for i, in := range envs {
		if in == nil {
			return nil, &EnqueueError{Index: i, Err: fmt.Errorf("nil envelope: %w", envelope.ErrInvalid)}
		}
		e := in.Clone()
		e.TenantID = in.Tenant()
		line, segs, err := envelope.ValidEncodingRows(e)
		if err != nil {
			return nil, &EnqueueError{Index: i, Tenant: e.TenantID, ID: e.ID, Err: err}
		}
		out[i] = Prepared{Env: e, Line: line, Segments: segs}
	}
	return out, nil
}
