package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// EnqueueResult is one entry of POST /v1/envelopes' results.
type EnqueueResult struct {
	Tenant   string `json:"tenant_id"`
	ID       string `json:"id"`
	Status   string `json:"status"` // "created" or "duplicate"
	Segments int    `json:"segments"`
}

// Enqueue statuses.
const (
	StatusCreated   = "created"
	StatusDuplicate = "duplicate"
)

// MaxProblems is the most problems one invalid_envelope answer lists; past
// it, a last problem (at the index of the first envelope whose problems
// are not all shown) says how many more there were.
const MaxProblems = 100

// postEnvelopes enqueues one envelope (a JSON object) or a batch (an
// array). Every envelope is parsed and validated first and its problems
// reported (up to MaxProblems); nothing is stored unless all are valid. 201 when at least one
// envelope was created, 200 when all were duplicates.
func (a *api) postEnvelopes(w http.ResponseWriter, r *http.Request) error {
	data, err := a.readBody(w, r)
	if err != nil {
		return err
	}
	docs, err := splitBody(data)
	if err != nil {
		return err
	}
	envs := make([]*envelope.Envelope, len(docs))
	var invalid *apiError
	more, moreAt := 0, 0 // problems past MaxProblems, and the envelope of the first
	for i, doc := range docs {
		e, err := envelope.Parse(doc)
		var ve *envelope.ValidationError
		switch {
		case errors.As(err, &ve):
			ps := invalidEnvelope(i, ve).Problems
			if invalid == nil {
				invalid = invalidEnvelope(i, &envelope.ValidationError{})
			}
			if room := MaxProblems - len(invalid.Problems); len(ps) > room {
				if more == 0 {
					moreAt = i
				}
				more += len(ps) - room
				ps = ps[:room]
			}
			invalid.Problems = append(invalid.Problems, ps...)
		case err != nil:
			return err
		default:
			envs[i] = e
		}
	}
	if invalid != nil {
		if more > 0 {
			invalid.Problems = append(invalid.Problems, Problem{Index: moreAt, Rule: strconv.Itoa(more) + " more problems not shown"})
		}
		return invalid
	}
	res, err := a.cfg.Store.Enqueue(r.Context(), envs...)
	if err != nil {
		return err
	}
	out := struct {
		Results []EnqueueResult `json:"results"`
	}{Results: make([]EnqueueResult, len(res))}
	status := http.StatusOK
	for i, x := range res {
		out.Results[i] = EnqueueResult{Tenant: x.Tenant, ID: x.ID, Status: StatusDuplicate, Segments: x.Segments}
		if !x.Duplicate {
			out.Results[i].Status = StatusCreated
			status = http.StatusCreated
		}
	}
	writeJSON(w, status, out)
	return nil
}

// splitBody cuts a POST /v1/envelopes body into its envelope documents:
// the object itself, or the elements of an array, as parts of data (no
// copy). An array is cut by one pass over its bytes that stops past
// MaxBatch elements, before anything is decoded; each envelope's own
// limits are envelope.Parse's (MaxEnvelopeBytes, MaxValues).
func splitBody(data []byte) ([][]byte, error) {
	data = bytes.TrimSpace(bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")))
	if len(data) == 0 || !json.Valid(data) {
		return nil, errBadJSON
	}
	switch data[0] {
	case '{':
		return [][]byte{data}, nil
	case '[':
		docs, ok := arrayElements(data, MaxBatch)
		if !ok {
			return nil, badRequest("too many envelopes in one request (at most " + strconv.Itoa(MaxBatch) + ")")
		}
		if len(docs) == 0 {
			return nil, badRequest("the array holds no envelopes")
		}
		return docs, nil
	}
	return nil, errBadJSON
}

// arrayElements returns the elements of data, a valid JSON array, as parts
// of it; false when it has more than most.
func arrayElements(data []byte, most int) ([][]byte, bool) {
	var out [][]byte
	depth, start := 0, -1
	inString, escaped := false, false
	cut := func(end int) bool {
		if el := bytes.TrimSpace(data[start:end]); len(el) > 0 {
			if len(out) == most {
				return false
			}
			out = append(out, el)
		}
		return true
	}
	for i, c := range data {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			if depth++; depth == 1 {
				start = i + 1
			}
		case ']', '}':
			if depth--; depth == 0 && !cut(i) {
				return nil, false
			}
		case ',':
			if depth == 1 {
				if !cut(i) {
					return nil, false
				}
				start = i + 1
			}
		}
	}
	return out, true
}

// getEnvelope answers the envelope's queue.EnvelopeStatus: its status,
// segments and attempt history; the envelope itself (recipient, payload:
// personal data) only with ?full=1.
func (a *api) getEnvelope(w http.ResponseWriter, r *http.Request) error {
	id, tenant, err := envelopeParams(r)
	if err != nil {
		return err
	}
	full, err := boolParam(r, "full")
	if err != nil {
		return err
	}
	st, err := a.cfg.Store.Get(r.Context(), tenant, id)
	if err != nil {
		return err
	}
	if !full {
		st.Envelope = nil
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

// boolParam parses an optional boolean query parameter ("1", "true", …).
func boolParam(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, badRequest(name + " must be a boolean")
	}
	return b, nil
}

func (a *api) listEnvelopes(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	tenant, err := tenantParam(r)
	if err != nil {
		return err
	}
	f := queue.ListFilter{Tenant: tenant, Cursor: q.Get("cursor")}
	if s := q.Get("state"); s != "" {
		if f.State, err = envelope.ParseState(s); err != nil {
			return badRequest("state: " + err.Error())
		}
	}
	if c := q.Get("channel"); c != "" {
		if f.Channel, err = envelope.ParseChannel(c); err != nil {
			return badRequest("channel: " + err.Error())
		}
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			return badRequest("limit must be an integer from 1 to 1000")
		}
		f.Limit = n
	}
	if len(f.Cursor) > 256 {
		return errBadCursor
	}
	page, err := a.cfg.Store.List(r.Context(), f)
	if err != nil {
		return err
	}
	if page.Rows == nil {
		page.Rows = []queue.Row{}
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// operatorReply is the answer of requeue and resolve.
type operatorReply struct {
	Status string `json:"status"`
}

func (a *api) requeue(w http.ResponseWriter, r *http.Request) error {
	id, tenant, err := envelopeParams(r)
	if err != nil {
		return err
	}
	if err := a.cfg.Store.Requeue(r.Context(), tenant, id); err != nil {
		return err
	}
	return a.replyStatus(w, r, tenant, id)
}

// resolveRequest is the body of POST /v1/envelopes/{id}/resolve.
type resolveRequest struct {
	As string `json:"as"` // "sent", or "retry" ("retryable")
}

func (a *api) resolve(w http.ResponseWriter, r *http.Request) error {
	id, tenant, err := envelopeParams(r)
	if err != nil {
		return err
	}
	var req resolveRequest
	if err := a.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	var as envelope.State
	switch req.As {
	case "sent":
		as = envelope.StateSent
	case "retry", "retryable":
		as = envelope.StateRetryable
	default:
		return badRequest(`"as" must be "sent" or "retry"`)
	}
	if err := a.cfg.Store.Resolve(r.Context(), tenant, id, as); err != nil {
		return err
	}
	return a.replyStatus(w, r, tenant, id)
}

// replyStatus answers 200 with the envelope's status after an action.
func (a *api) replyStatus(w http.ResponseWriter, r *http.Request, tenant, id string) error {
	st, err := a.cfg.Store.Get(r.Context(), tenant, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, operatorReply{Status: st.Status})
	return nil
}

// ConsentView is GET and PUT /v1/consent/{user_id}: the flags and the
// suppressions (channel, opaque target hash, reason).
type ConsentView struct {
	Tenant string `json:"tenant_id"`
	UserID string `json:"user_id"`
	queue.Consent
}

func (a *api) consentArgs(r *http.Request) (tenant, user string, err error) {
	user = r.PathValue("user_id")
	if err := checkID("user_id", user, false); err != nil {
		return "", "", err
	}
	tenant, err = tenantParam(r)
	return tenant, user, err
}

func (a *api) getConsent(w http.ResponseWriter, r *http.Request) error {
	tenant, user, err := a.consentArgs(r)
	if err != nil {
		return err
	}
	return a.replyConsent(w, r, tenant, user)
}

func (a *api) putConsent(w http.ResponseWriter, r *http.Request) error {
	tenant, user, err := a.consentArgs(r)
	if err != nil {
		return err
	}
	var f queue.ConsentFlags
	if err := a.decodeJSON(w, r, &f, true); err != nil {
		return err
	}
	switch f.Cadence {
	case "", "weekly", "daily":
	default:
		return badRequest(`cadence must be "weekly" or "daily"`)
	}
	if err := checkID("by", f.By, true); err != nil {
		return err
	}
	if f.By == "" {
		f.By = "api" // the history says the change came over HTTP
	}
	if err := a.cfg.Store.SetConsent(r.Context(), tenant, user, f); err != nil {
		return err
	}
	return a.replyConsent(w, r, tenant, user)
}

func (a *api) replyConsent(w http.ResponseWriter, r *http.Request, tenant, user string) error {
	c, err := a.cfg.Store.Consent(r.Context(), tenant, user)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ConsentView{Tenant: tenantOr(tenant), UserID: user, Consent: c})
	return nil
}

// Stats is GET /v1/stats: row counts by state and channel, and the totals
// by state and by channel.
type Stats struct {
	Tenant    string                                      `json:"tenant_id,omitempty"` // "" = every tenant
	Counts    map[envelope.State]map[envelope.Channel]int `json:"counts"`
	ByState   map[envelope.State]int                      `json:"by_state"`
	ByChannel map[envelope.Channel]int                    `json:"by_channel"`
	Total     int                                         `json:"total"`
}

func (a *api) stats(w http.ResponseWriter, r *http.Request) error {
	tenant, err := tenantParam(r)
	if err != nil {
		return err
	}
	c, err := a.cfg.Store.Counts(r.Context(), tenant)
	if err != nil {
		return err
	}
	s := Stats{Tenant: tenant, Counts: map[envelope.State]map[envelope.Channel]int{},
		ByState: map[envelope.State]int{}, ByChannel: map[envelope.Channel]int{}}
	for st, chans := range c {
		for ch, n := range chans {
			if n == 0 {
				continue
			}
			if s.Counts[st] == nil {
				s.Counts[st] = map[envelope.Channel]int{}
			}
			s.Counts[st][ch] += n
			s.ByState[st] += n
			s.ByChannel[ch] += n
			s.Total += n
		}
	}
	writeJSON(w, http.StatusOK, s)
	return nil
}

// envelopeParams reads and checks the {id} path value and the tenant query
// parameter of an envelope route.
func envelopeParams(r *http.Request) (id, tenant string, err error) {
	id = r.PathValue("id")
	if err := checkID("id", id, false); err != nil {
		return "", "", err
	}
	tenant, err = tenantParam(r)
	return id, tenant, err
}
