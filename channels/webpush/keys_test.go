package webpush

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGenerateKeys(t *testing.T) {
	a := mustKeys(t)
	b := mustKeys(t)
	if err := a.Validate(); err != nil {
		t.Fatalf("generated keys do not validate: %v", err)
	}
	if a.Public == b.Public || a.Private == b.Private {
		t.Errorf("two generated pairs are equal")
	}
	pub, err := base64.RawURLEncoding.DecodeString(a.Public)
	if err != nil || len(pub) != 65 || pub[0] != 4 {
		t.Errorf("public key is not raw URL base64 of a 65-byte uncompressed point (len %d, err %v)", len(pub), err)
	}
	priv, err := base64.RawURLEncoding.DecodeString(string(a.Private))
	if err != nil || len(priv) != 32 {
		t.Errorf("private key is not raw URL base64 of 32 bytes (len %d, err %v)", len(priv), err)
	}
	// The library returns the private key first; GenerateKeys must not
	// mix them up (a swapped pair fails validation).
	if err := (Keys{Public: string(a.Private), Private: Secret(a.Public)}).Validate(); err == nil {
		t.Errorf("a swapped pair validated")
	}
	// Padded URL base64 is accepted too (webpush-go accepts both).
	padded := Keys{Public: base64.URLEncoding.EncodeToString(pub), Private: Secret(base64.URLEncoding.EncodeToString(priv))}
	if err := padded.Validate(); err != nil {
		t.Errorf("padded encoding rejected: %v", err)
	}
}

func TestSecret_Redacts(t *testing.T) {
	k := mustKeys(t)
	opts := Options{VAPIDPublicKey: k.Public, VAPIDPrivateKey: k.Private, Subscriber: "ops@example.com"}
	var buf syncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	log.Info("config", "private", opts.VAPIDPrivateKey, "keys", k)
	js, err := json.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		fmt.Sprint(opts), fmt.Sprintf("%v", opts), fmt.Sprintf("%+v", opts), fmt.Sprintf("%#v", opts),
		fmt.Sprintf("%s", opts.VAPIDPrivateKey), //lint:ignore S1025 the %s verb is what is tested
		fmt.Sprintf("%q", opts.VAPIDPrivateKey), fmt.Sprintf("%x", opts.VAPIDPrivateKey),
		fmt.Sprintf("%+v", k), string(js), buf.String(),
	} {
		if strings.Contains(s, string(k.Private)) {
			t.Errorf("private key leaked in %q", s)
		}
	}
	if !strings.Contains(buf.String(), "[redacted]") || !strings.Contains(string(js), "[redacted]") {
		t.Errorf("want [redacted] in log %q and JSON %q", buf.String(), js)
	}
}

func TestKeysFromEnv(t *testing.T) {
	k := mustKeys(t)
	other := mustKeys(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pubFile := write("pub", k.Public+"\n")
	privFile := write("priv", "  "+string(k.Private)+"\n")
	emptyFile := write("empty", "\n")
	missing := filepath.Join(dir, "missing")

	for _, tc := range []struct {
		name    string
		env     map[string]string
		wantErr string // substring; "" = success
		noKeys  bool
	}{
		{name: "Direct", env: map[string]string{EnvPublicKey: k.Public, EnvPrivateKey: string(k.Private)}},
		{name: "Files", env: map[string]string{EnvPublicKey + "_FILE": pubFile, EnvPrivateKey + "_FILE": privFile}},
		{name: "Mixed", env: map[string]string{EnvPublicKey: k.Public, EnvPrivateKey + "_FILE": privFile}},
		{name: "Nothing", env: map[string]string{}, noKeys: true},
		{name: "OnlyPublic", env: map[string]string{EnvPublicKey: k.Public}, wantErr: EnvPrivateKey},
		{name: "OnlyPrivate", env: map[string]string{EnvPrivateKey: string(k.Private)}, wantErr: EnvPublicKey},
		{name: "Both", env: map[string]string{EnvPublicKey: k.Public, EnvPrivateKey: string(k.Private), EnvPrivateKey + "_FILE": privFile}, wantErr: EnvPrivateKey + "_FILE"},
		{name: "MissingFile", env: map[string]string{EnvPublicKey: k.Public, EnvPrivateKey + "_FILE": missing}, wantErr: EnvPrivateKey + "_FILE: file does not exist"},
		{name: "EmptyFile", env: map[string]string{EnvPublicKey: k.Public, EnvPrivateKey + "_FILE": emptyFile}, wantErr: EnvPrivateKey + "_FILE: the file is empty"},
		{name: "NotAPair", env: map[string]string{EnvPublicKey: k.Public, EnvPrivateKey: string(other.Private)}, wantErr: "not one pair"},
		{name: "BadPrivate", env: map[string]string{EnvPublicKey: k.Public, EnvPrivateKey: "bm9wZQ"}, wantErr: EnvPrivateKey},
		{name: "BadPublic", env: map[string]string{EnvPublicKey: "bm9wZQ", EnvPrivateKey: string(k.Private)}, wantErr: EnvPublicKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := KeysFromEnv(func(name string) string { return tc.env[name] })
			switch {
			case tc.noKeys:
				if !errors.Is(err, ErrNoKeys) {
					t.Fatalf("err = %v, want ErrNoKeys", err)
				}
				return
			case tc.wantErr == "":
				if err != nil {
					t.Fatalf("KeysFromEnv: %v", err)
				}
				if got != k {
					t.Errorf("KeysFromEnv returned a different pair")
				}
				return
			}
			if err == nil {
				t.Fatalf("KeysFromEnv succeeded, want an error containing %q", tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err = %q, want it to contain %q", err, tc.wantErr)
			}
			for _, v := range []string{k.Public, string(k.Private), string(other.Private), dir} {
				if strings.Contains(err.Error(), v) {
					t.Errorf("error %q contains a value or path", err)
				}
			}
		})
	}
}
