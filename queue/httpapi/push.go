package httpapi

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"

	"github.com/outboxhq/outbox/envelope"
)

// pushUser returns whose subscription a push route acts on: Config.User's
// answer, or ?tenant=&user= when there is no Config.User (those routes
// then sit behind the bearer token).
func (a *api) pushUser(r *http.Request) (tenant, user string, err error) {
	if a.cfg.User != nil {
		tenant, user, err = a.cfg.User(r)
		if err != nil {
			return "", "", errUnauthorized
		}
	} else {
		tenant, user = r.URL.Query().Get("tenant"), r.URL.Query().Get("user")
	}
	if err := checkID("tenant", tenant, true); err != nil {
		return "", "", err
	}
	if err := checkID("user", user, false); err != nil {
		return "", "", err
	}
	return tenant, user, nil
}

// subscribeReply is the answer of the push-subscription routes.
type subscribeReply struct {
	Status string `json:"status"` // "subscribed" or "unsubscribed"
}

// pushSubscribe saves the W3C PushSubscription in the body for the user
// (replacing one with the same endpoint, lifting a suppression an earlier
// 404/410 left on it). It does not change consent flags: push_enabled is
// the app's to set.
func (a *api) pushSubscribe(w http.ResponseWriter, r *http.Request) error {
	tenant, user, err := a.pushUser(r)
	if err != nil {
		return err
	}
	if err := requireJSON(r); err != nil {
		return err
	}
	var sub envelope.PushSubscription
	if err := a.decodeJSON(w, r, &sub, false); err != nil {
		return err
	}
	if err := checkSubscription(&sub); err != nil {
		return err
	}
	if err := a.cfg.Store.SaveSubscription(r.Context(), tenant, user, sub); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, subscribeReply{Status: "subscribed"})
	return nil
}

// unsubscribeRequest is the body of DELETE /api/app/push/subscribe.
type unsubscribeRequest struct {
	Endpoint string `json:"endpoint"`
}

// pushUnsubscribe removes the user's subscription with the endpoint in the
// body (404 when there is none).
func (a *api) pushUnsubscribe(w http.ResponseWriter, r *http.Request) error {
	tenant, user, err := a.pushUser(r)
	if err != nil {
		return err
	}
	if err := requireJSON(r); err != nil {
		return err
	}
	var req unsubscribeRequest
	if err := a.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Endpoint == "" || len(req.Endpoint) > envelope.MaxURLBytes {
		return badRequest("endpoint is required")
	}
	if err := a.cfg.Store.DeleteSubscription(r.Context(), tenant, user, req.Endpoint); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, subscribeReply{Status: "unsubscribed"})
	return nil
}

// vapidKey answers the VAPID public key a page passes to
// pushManager.subscribe as applicationServerKey.
func (a *api) vapidKey(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, struct {
		PublicKey string `json:"public_key"`
	}{a.cfg.VAPIDPublicKey})
	return nil
}

// checkSubscription validates a PushSubscription: an https endpoint, a
// P-256 public key (65 bytes, uncompressed) and a 16-byte auth secret,
// both base64url. Messages never quote the values.
func checkSubscription(s *envelope.PushSubscription) error {
	if s.Endpoint == "" {
		return badRequest("endpoint is required")
	}
	u, err := url.Parse(s.Endpoint)
	if len(s.Endpoint) > envelope.MaxURLBytes || err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
		return badRequest("endpoint must be an https URL")
	}
	if k, ok := decodeB64(s.Keys.P256dh); !ok || len(k) != 65 || k[0] != 4 {
		return badRequest("keys.p256dh must be an uncompressed P-256 public key in base64url")
	}
	if k, ok := decodeB64(s.Keys.Auth); !ok || len(k) != 16 {
		return badRequest("keys.auth must be 16 bytes in base64url")
	}
	if s.ExpirationTime != nil && *s.ExpirationTime < 0 {
		return badRequest("expirationTime must not be negative")
	}
	return nil
}

// decodeB64 decodes base64url with or without padding (and, leniently,
// standard base64, which some clients send).
func decodeB64(s string) ([]byte, bool) {
	if s == "" || len(s) > 256 {
		return nil, false
	}
	s = strings.TrimRight(s, "=")
	if b, err := base64.RawURLEncoding.DecodeString(s); err == nil {
		return b, true
	}
	if b, err := base64.RawStdEncoding.DecodeString(s); err == nil {
		return b, true
	}
	return nil, false
}
