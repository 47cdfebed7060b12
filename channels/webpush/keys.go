package webpush

import (
	"bytes"
	"crypto/ecdh"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	wp "github.com/SherClockHolmes/webpush-go"
)

// Environment variables read by KeysFromEnv. Each may instead be given as a
// file path in the same name with a "_FILE" suffix (for example
// OUTBOX_VAPID_PRIVATE_KEY_FILE), which is how `outbox vapid-keys --out DIR`
// leaves them.
const (
	EnvPublicKey  = "OUTBOX_VAPID_PUBLIC_KEY"
	EnvPrivateKey = "OUTBOX_VAPID_PRIVATE_KEY"
)

// File names written by `outbox vapid-keys --out DIR`.
const (
	PublicKeyFile  = "vapid_public.key"
	PrivateKeyFile = "vapid_private.key"
)

// ErrNoKeys is returned by KeysFromEnv when neither key is configured, so
// that a caller can run without the push channel.
var ErrNoKeys = errors.New("webpush: no VAPID keys configured (set " + EnvPublicKey + " and " + EnvPrivateKey + ", or their _FILE variants)")

// redacted is what a Secret prints.
const redacted = "[redacted]"

// Secret is a credential. It prints, logs and marshals as "[redacted]", so
// that an Options value can be logged or formatted without leaking it; use
// string(s) to read the value.
type Secret string

// String returns "[redacted]".
func (Secret) String() string { return redacted }

// GoString returns "[redacted]" (for %#v).
func (Secret) GoString() string { return redacted }

// LogValue implements slog.LogValuer: a Secret logs as "[redacted]".
func (Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalText implements encoding.TextMarshaler: a Secret marshals (to JSON,
// too) as "[redacted]".
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// Keys is a VAPID key pair (RFC 8292), both halves URL-safe base64 as
// webpush-go and browsers use them: Public is the uncompressed P-256 point
// (65 bytes) a browser passes as applicationServerKey, Private the 32-byte
// scalar.
type Keys struct {
	Public  string
	Private Secret
}

// GenerateKeys returns a new VAPID key pair. (webpush-go's
// GenerateVAPIDKeys returns the private key first; this does not.)
func GenerateKeys() (Keys, error) {
	priv, pub, err := wp.GenerateVAPIDKeys()
	if err != nil {
		return Keys{}, fmt.Errorf("webpush: generate VAPID keys: %w", err)
	}
	return Keys{Public: pub, Private: Secret(priv)}, nil
}

// Validate reports whether k is a matching P-256 key pair in the encodings
// webpush-go accepts. Its errors name the half at fault, never the value.
func (k Keys) Validate() error {
	_, err := k.check()
	return err
}

// Which half of a key pair a validation error is about.
const (
	halfPublic  = "public"
	halfPrivate = "private"
	halfBoth    = "both"
)

// check validates k and says which half is at fault.
func (k Keys) check() (half string, err error) {
	pub, err := decodeVAPIDKey(k.Public)
	if err != nil || len(pub) == 0 {
		return halfPublic, errors.New("webpush: VAPID public key is not URL-safe base64")
	}
	pubKey, err := ecdh.P256().NewPublicKey(pub)
	if err != nil {
		return halfPublic, errors.New("webpush: VAPID public key is not an uncompressed P-256 point (65 bytes)")
	}
	priv, err := decodeVAPIDKey(string(k.Private))
	if err != nil || len(priv) == 0 {
		return halfPrivate, errors.New("webpush: VAPID private key is not URL-safe base64")
	}
	privKey, err := ecdh.P256().NewPrivateKey(priv)
	if err != nil {
		return halfPrivate, errors.New("webpush: VAPID private key is not a P-256 private key (32 bytes)")
	}
	if !privKey.PublicKey().Equal(pubKey) {
		return halfBoth, errors.New("webpush: VAPID public and private keys are not one pair")
	}
	return "", nil
}

// checkNamed validates k and names the settings at fault in the error.
func (k Keys) checkNamed(public, private string) error {
	half, err := k.check()
	switch half {
	case "":
		return nil
	case halfPublic:
		return fmt.Errorf("%w (%s)", err, public)
	case halfPrivate:
		return fmt.Errorf("%w (%s)", err, private)
	}
	return fmt.Errorf("%w (%s, %s)", err, public, private)
}

// decodeVAPIDKey decodes key the way webpush-go does: padded or raw URL-safe
// base64.
func decodeVAPIDKey(key string) ([]byte, error) {
	if b, err := base64.URLEncoding.DecodeString(key); err == nil {
		return b, nil
	}
	return base64.RawURLEncoding.DecodeString(key)
}

// KeysFromEnv reads the VAPID key pair from the environment through getenv
// (os.Getenv in a program, a map lookup in a test): each key from
// EnvPublicKey / EnvPrivateKey, or from the file named by the same variable
// with a "_FILE" suffix. Surrounding white space is trimmed. It returns
// ErrNoKeys when nothing is set, and an error naming the variable (never its
// value) when only one key is set, a variable and its _FILE twin are both
// set, a file cannot be read, or the keys are not a valid pair.
func KeysFromEnv(getenv func(string) string) (Keys, error) {
	pub, pubSet, err := secretFromEnv(getenv, EnvPublicKey)
	if err != nil {
		return Keys{}, err
	}
	priv, privSet, err := secretFromEnv(getenv, EnvPrivateKey)
	if err != nil {
		return Keys{}, err
	}
	switch {
	case !pubSet && !privSet:
		return Keys{}, ErrNoKeys
	case !pubSet:
		return Keys{}, fmt.Errorf("webpush: %s is set but %s is not", EnvPrivateKey, EnvPublicKey)
	case !privSet:
		return Keys{}, fmt.Errorf("webpush: %s is set but %s is not", EnvPublicKey, EnvPrivateKey)
	}
	k := Keys{Public: pub, Private: Secret(priv)}
	if err := k.checkNamed(EnvPublicKey, EnvPrivateKey); err != nil {
		return Keys{}, err
	}
	return k, nil
}

// secretFromEnv reads name or name_FILE. set is false when neither is set.
func secretFromEnv(getenv func(string) string, name string) (value string, set bool, err error) {
	direct := strings.TrimSpace(getenv(name))
	path := strings.TrimSpace(getenv(name + "_FILE"))
	switch {
	case direct != "" && path != "":
		return "", false, fmt.Errorf("webpush: set only one of %s and %s_FILE", name, name)
	case direct != "":
		return direct, true, nil
	case path != "":
		b, err := os.ReadFile(path)
		if err != nil {
			// The path is configuration, not a secret, but the error text
			// of os.ReadFile is kept out: only the failure kind is named.
			switch {
			case errors.Is(err, os.ErrNotExist):
				return "", false, fmt.Errorf("webpush: %s_FILE: file does not exist", name)
			case errors.Is(err, os.ErrPermission):
				return "", false, fmt.Errorf("webpush: %s_FILE: permission denied", name)
			}
			return "", false, fmt.Errorf("webpush: %s_FILE: cannot read the file", name)
		}
		v := string(bytes.TrimSpace(b))
		if v == "" {
			return "", false, fmt.Errorf("webpush: %s_FILE: the file is empty", name)
		}
		return v, true, nil
	}
	return "", false, nil
}
