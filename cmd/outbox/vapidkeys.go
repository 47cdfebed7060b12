package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/outboxhq/outbox/channels/webpush"
)

func init() {
	register(&command{Name: "vapid-keys", Short: "generate a VAPID key pair for Web Push (prints it, or writes it with --out DIR)", Run: runVAPIDKeys})
}

const vapidKeysUsage = `Usage: outbox vapid-keys [--out DIR [--force]]

Generates a VAPID key pair (P-256) for Web Push.

Without --out it prints the pair as environment lines, ready for an env file:
  OUTBOX_VAPID_PUBLIC_KEY=…
  OUTBOX_VAPID_PRIVATE_KEY=…

With --out DIR it writes DIR/` + webpush.PublicKeyFile + ` and DIR/` + webpush.PrivateKeyFile + ` (mode 0600,
DIR created 0700 if missing) and prints the _FILE variables that point at them;
the private key is not printed.

Browsers' push subscriptions are bound to the public key: replacing the pair
strands every existing subscription, so existing files are never replaced
without --force.

Flags:
`

func runVAPIDKeys(_ context.Context, e *env, args []string) int {
	fs := flag.NewFlagSet("vapid-keys", flag.ContinueOnError)
	out := fs.String("out", "", "write the key files into `DIR` instead of printing the keys")
	force := fs.Bool("force", false, "with --out, replace existing key files (existing push subscriptions stop working)")
	fs.Usage = func() { fmt.Fprint(fs.Output(), vapidKeysUsage); fs.PrintDefaults() }
	if code, done := parseFlags(fs, e, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.Stderr, "Error: vapid-keys takes no arguments\nTry: outbox help vapid-keys\n")
		return exitUsage
	}
	if *force && *out == "" {
		fmt.Fprintf(e.Stderr, "Error: --force needs --out\nTry: outbox help vapid-keys\n")
		return exitUsage
	}
	keys, err := webpush.GenerateKeys()
	if err != nil {
		return fail(e, "%v", err)
	}
	if *out == "" {
		fmt.Fprintf(e.Stdout, "%s=%s\n%s=%s\n", webpush.EnvPublicKey, keys.Public, webpush.EnvPrivateKey, string(keys.Private))
		return exitOK
	}
	dir, err := filepath.Abs(*out)
	if err != nil {
		return fail(e, "--out: %v", err)
	}
	if err := writeVAPIDKeys(dir, keys, *force); err != nil {
		return fail(e, "%v", err)
	}
	fmt.Fprintf(e.Stdout, "%s_FILE=%s\n%s_FILE=%s\n",
		webpush.EnvPublicKey, filepath.Join(dir, webpush.PublicKeyFile),
		webpush.EnvPrivateKey, filepath.Join(dir, webpush.PrivateKeyFile))
	return exitOK
}

// writeVAPIDKeys writes the pair into dir, each file crash-safely (a temp
// file in dir, fsync, rename, fsync of dir) with mode 0600. Unless force is
// set it fails, writing nothing, when either file exists.
func writeVAPIDKeys(dir string, keys webpush.Keys, force bool) error {
	files := []struct{ name, content string }{
		{webpush.PublicKeyFile, keys.Public + "\n"},
		{webpush.PrivateKeyFile, string(keys.Private) + "\n"},
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create the --out directory: %w", err)
	}
	if !force {
		for _, f := range files {
			if _, err := os.Lstat(filepath.Join(dir, f.name)); err == nil {
				return fmt.Errorf("%s already exists in %s: replacing the keys strands every push subscription (use --force to replace them)", f.name, dir)
			} else if !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("check %s: %w", f.name, err)
			}
		}
	}
	for _, f := range files {
		if err := writeFileAtomic(dir, f.name, f.content); err != nil {
			return fmt.Errorf("write %s: %w", f.name, err)
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// writeFileAtomic writes content to dir/name through a synced temp file
// renamed into place, with mode 0600.
func writeFileAtomic(dir, name, content string) (err error) {
	tmp, err := os.CreateTemp(dir, "."+name+".*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if err = tmp.Chmod(0o600); err != nil {
		_ = tmp.Close()
		return err
	}
	if _, err = io.WriteString(tmp, content); err != nil {
		_ = tmp.Close()
		return err
	}
	if err = tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, name))
}
