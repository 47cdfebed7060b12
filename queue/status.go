package queue

import (
	"encoding/base64"
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/outboxhq/outbox/envelope"
)

// The operator's view of an envelope, which every store builds the same way.

// Segment returns the status of row d as segment index of its envelope
// (its history copied).
func (d *Delivery) Segment(index int) SegmentStatus {
	return SegmentStatus{
		Index: index, State: d.State, Attempts: d.Attempts, Class: d.Class, Receipt: d.Receipt,
		Fence: d.Fence, NextAt: d.Due, LeaseEnd: d.LeaseEnd, UpdatedAt: d.Updated,
		History: slices.Clone(d.History),
	}
}

// Aggregate is an envelope's status from its segments: StatusDelivered
// when every one is sent, else the state of the first one that is not.
func Aggregate(segs []SegmentStatus) string {
	for _, s := range segs {
		if s.State != envelope.StateSent {
			return string(s.State)
		}
	}
	return StatusDelivered
}

// PageLimit is the number of rows a List page holds for f: f.Limit, 50
// when it is not positive, at most 1000.
func PageLimit(f ListFilter) int {
	if f.Limit <= 0 {
		return 50
	}
	return min(f.Limit, 1000)
}

// ErrBadCursor is a List cursor that no page handed out.
var ErrBadCursor = errors.New("queue: invalid list cursor")

// EncodeCursor is the List cursor after row (seq, seg) of a store that
// orders envelopes by a sequence number (memstore, pgstore).
func EncodeCursor(seq uint64, seg int) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatUint(seq, 10) + "." + strconv.Itoa(seg)))
}

// DecodeCursor reads an EncodeCursor cursor (ErrBadCursor otherwise).
func DecodeCursor(c string) (uint64, int, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return 0, 0, ErrBadCursor
	}
	a, z, ok := strings.Cut(string(b), ".")
	if !ok {
		return 0, 0, ErrBadCursor
	}
	seq, err1 := strconv.ParseUint(a, 10, 64)
	seg, err2 := strconv.Atoi(z)
	if err1 != nil || err2 != nil || seg < 0 {
		return 0, 0, ErrBadCursor
	}
	return seq, seg, nil
}
