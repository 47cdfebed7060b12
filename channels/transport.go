package channels

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"

	"github.com/outboxhq/outbox/envelope"
)

// Redacted causes of ClassifyTransport's errors: the raw ones quote the
// URL, and with it a token (Telegram's) or an endpoint (Web Push's).
var (
	errUnreachable = errors.New("the service could not be reached (no connection was made)")
	errNetwork     = errors.New("network error")
	errTimeout     = errors.New("call timed out")
)

// ClassifyTransport maps an error from an HTTP call that got no response
// to a retryable DeliveryError without the error's text. A call that
// failed before a connection to the service was made (the name did not
// resolve, the connection was refused or unroutable, the TLS handshake
// failed) sent nothing: envelope.ClassUnreachable, which the worker
// retries even for a provider that cannot redeliver idempotently (a
// Telegram outage, or this host's network down, must not leave every
// chat reply unresolved). Anything later may have reached the service:
// timeout or network_error.
func ClassifyTransport(err error) error {
	if NotConnected(err) {
		return envelope.Retryable(envelope.ClassUnreachable, errUnreachable)
	}
	var t interface{ Timeout() bool }
	switch {
	case errors.Is(err, context.Canceled):
		return envelope.Retryable(envelope.ClassTimeout, context.Canceled)
	case errors.Is(err, context.DeadlineExceeded):
		return envelope.Retryable(envelope.ClassTimeout, context.DeadlineExceeded)
	case errors.As(err, &t) && t.Timeout():
		return envelope.Retryable(envelope.ClassTimeout, errTimeout)
	}
	return envelope.Retryable(envelope.ClassNetwork, errNetwork)
}

// NotConnected reports whether err is a failure before any byte of the
// request could reach the service: resolving its name, connecting (or
// connecting through a proxy), a server that does not speak TLS, or its
// certificate refused. A TLS alert is not among them: one may come after
// the request was sent.
func NotConnected(err error) bool {
	var (
		op   *net.OpError
		dns  *net.DNSError
		cert *tls.CertificateVerificationError
		rec  tls.RecordHeaderError
		auth x509.UnknownAuthorityError
		host x509.HostnameError
		inv  x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &op) && (op.Op == "dial" || op.Op == "proxyconnect"):
		return true
	case errors.As(err, &dns), errors.As(err, &cert), errors.As(err, &rec),
		errors.As(err, &auth), errors.As(err, &host), errors.As(err, &inv):
		return true
	}
	return false
}
