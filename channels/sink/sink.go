// Package sink is the embedded default provider (SPEC §8): instead of
// sending, it writes each rendered message into the data directory, so the
// whole delivery loop runs with no credentials and a person can open what
// would have been sent.
//
// Layout, under the data directory dir:
//
//	sink/email/<key hash>.eml      an RFC 5322 multipart/alternative message
//	sink/push/<key hash>.json      {endpoint, ttl, urgency, topic, payload}
//	sink/telegram/<key hash>.json  {chat_id, text, parse_mode, segment, segments}
//
// Files are named by the delivery key's hash, so a redelivery of the same
// key overwrites its file instead of adding one (IdempotentRedelivery), and
// Reconcile answers from the file's existence. Every file is written
// atomically: a temporary file in the same directory, fsync, rename, fsync
// of the directory.
//
// The data directory itself must exist (the store creates it); the sink
// creates sink/<channel> below it. A missing data directory is treated as an
// unavailable service (a retryable provider_unavailable error), never
// silently re-created, because it usually means a volume is not mounted.
package sink

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/internal/nofollow"
	"github.com/outboxhq/outbox/render"
	"golang.org/x/sys/unix"
)

// Name is the provider name the sink reports in Capabilities.
const Name = "sink"

// DefaultFrom is the From address of the .eml files when Options.From is empty.
const DefaultFrom = render.DefaultFrom

// Permissions of what the sink creates: the files hold personal data.
const (
	dirPerm  fs.FileMode = 0o700
	filePerm fs.FileMode = 0o600
)

// Options configures a sink. The zero value (or nil) means the defaults.
type Options struct {
	// From is the From header of the .eml files (default DefaultFrom).
	From string
	// Now returns the time written as the Date of the .eml files (default
	// time.Now).
	Now func() time.Time
	// Journal, when set, appends one line per Deliver call (the key's hash)
	// to <data>/sink/<channel>.journal after the message is written. The
	// kill drill counts it to prove that no key was delivered twice.
	Journal bool
}

// Provider writes the messages of one channel into the data directory.
// It is safe for concurrent use.
type Provider struct {
	dataDir string
	dir     string // dataDir/sink/<channel>
	ch      envelope.Channel
	ext     string
	from    string
	now     func() time.Time
	journal bool
	jmu     sync.Mutex
}

// New returns the sink for channel ch writing under the data directory
// dataDir. It returns an error when dataDir is empty or ch is not a known
// channel; it touches nothing on disk.
func New(dataDir string, ch envelope.Channel, opts *Options) (*Provider, error) {
	if dataDir == "" {
		return nil, errors.New("sink: data directory is empty")
	}
	if !ch.Valid() {
		return nil, fmt.Errorf("sink: unknown channel %q", ch)
	}
	p := &Provider{
		dataDir: dataDir,
		dir:     filepath.Join(dataDir, "sink", string(ch)),
		ch:      ch,
		ext:     ".json",
		from:    DefaultFrom,
		now:     time.Now,
	}
	if ch == envelope.ChannelEmail {
		p.ext = ".eml"
	}
	if opts != nil {
		if opts.From != "" {
			p.from = opts.From
		}
		if opts.Now != nil {
			p.now = opts.Now
		}
		p.journal = opts.Journal
	}
	return p, nil
}

// Path returns the file the message of key is (or would be) written to.
func (p *Provider) Path(key envelope.Key) string {
	return filepath.Join(p.dir, p.name(key))
}

// name returns the base name of key's file; it is also the receipt id.
func (p *Provider) name(key envelope.Key) string { return key.Hash() + p.ext }

// Capabilities reports the name "sink", the channel, and idempotent
// redelivery (a redelivery overwrites the same file).
func (p *Provider) Capabilities() channels.Capabilities {
	return channels.Capabilities{Name: Name, Channel: p.ch, IdempotentRedelivery: true}
}

// Deliver writes msg to Path(key) and returns the file's base name as the
// receipt. A message for another channel is a permanent invalid_request
// error; a file system failure is a retryable provider_unavailable error
// whose text holds neither the path nor anything of the message.
func (p *Provider) Deliver(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Receipt, error) {
	if err := ctx.Err(); err != nil {
		return channels.Receipt{}, ctxError(err)
	}
	data, err := p.encode(key, msg)
	if err != nil {
		return channels.Receipt{}, envelope.Permanent(envelope.ClassInvalidRequest, err)
	}
	dir, err := p.openDir(true)
	if err != nil {
		return channels.Receipt{}, envelope.Retryable(envelope.ClassProviderUnavailable, err)
	}
	defer dir.Close()
	if err := writeAtomic(dir, p.name(key), data); err != nil {
		return channels.Receipt{}, envelope.Retryable(envelope.ClassProviderUnavailable, err)
	}
	if p.journal {
		if err := p.appendJournal(key); err != nil {
			return channels.Receipt{}, envelope.Retryable(envelope.ClassProviderUnavailable, err)
		}
	}
	return channels.Receipt{ID: p.name(key)}, nil
}

// Reconcile answers Accepted (receipt = the file's base name) when key's
// file exists, Rejected when it does not; a file system failure is Unknown
// with a retryable provider_unavailable error.
func (p *Provider) Reconcile(ctx context.Context, key envelope.Key, _ *envelope.Message) (channels.Reconciliation, error) {
	if err := ctx.Err(); err != nil {
		return channels.Reconciliation{}, ctxError(err)
	}
	dir, err := p.openDir(false)
	if errors.Is(err, fs.ErrNotExist) {
		// Only a present data directory makes the absence meaningful.
		if _, derr := os.Stat(p.dataDir); derr != nil {
			return channels.Reconciliation{}, envelope.Retryable(envelope.ClassProviderUnavailable, derr)
		}
		return channels.Reconciliation{Outcome: channels.Rejected}, nil
	}
	if err != nil {
		return channels.Reconciliation{}, envelope.Retryable(envelope.ClassProviderUnavailable, err)
	}
	defer dir.Close()
	st, err := dir.Lstat(p.name(key))
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG:
		return channels.Reconciliation{Outcome: channels.Accepted, Receipt: channels.Receipt{ID: p.name(key)}}, nil
	case err == nil:
		return channels.Reconciliation{}, envelope.Retryable(envelope.ClassProviderUnavailable, errors.New("sink: not a regular file"))
	case errors.Is(err, fs.ErrNotExist):
		return channels.Reconciliation{Outcome: channels.Rejected}, nil
	}
	return channels.Reconciliation{}, envelope.Retryable(envelope.ClassProviderUnavailable, err)
}

// ctxError classifies a context's error.
func ctxError(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return envelope.Retryable(envelope.ClassTimeout, err)
	}
	return envelope.Retryable(envelope.ClassInterrupted, err)
}

// openDir opens sink/<channel> below the data directory, which must
// exist, creating the two directories when create is set. Neither is ever
// followed as a symbolic link (a *nofollow.LinkError naming it): what the
// sink writes stays inside the data directory.
func (p *Provider) openDir(create bool) (*nofollow.Dir, error) {
	fi, err := os.Stat(p.dataDir)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, errors.New("sink: data directory is not a directory")
	}
	d, err := nofollow.OpenDir(p.dataDir, filepath.Join("sink", string(p.ch)), create, dirPerm)
	if err != nil {
		return nil, fmt.Errorf("sink: %w", err)
	}
	return d, nil
}

// CheckDir reports a symbolic link planted as the sink's directories
// (sink, sink/<channel>) with an error naming it, for a start to refuse:
// Deliver's own error says only provider_unavailable. Directories not
// created yet are fine.
func (p *Provider) CheckDir() error {
	d, err := p.openDir(false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return d.Close()
}

// pushFile is the JSON written for a push message.
type pushFile struct {
	Endpoint string          `json:"endpoint"`
	TTL      int64           `json:"ttl"` // seconds
	Urgency  string          `json:"urgency,omitempty"`
	Topic    string          `json:"topic,omitempty"`
	Payload  json.RawMessage `json:"payload"`
}

// chatFile is the JSON written for a chat message.
type chatFile struct {
	ChatID    string `json:"chat_id"`
	Text      string `json:"text"`
	ParseMode string `json:"parse_mode,omitempty"`
	Segment   int    `json:"segment"`
	Segments  int    `json:"segments"`
}

// weComFile is the JSON written for a WeCom message.
type weComFile struct {
	User     string `json:"wecom_user,omitempty"`
	Agent    string `json:"wecom_agent,omitempty"`
	Robot    string `json:"robot,omitempty"`
	MsgType  string `json:"msgtype"`
	Content  string `json:"content"`
	Segment  int    `json:"segment"`
	Segments int    `json:"segments"`
}

// encode returns the file contents for msg. Its errors name only the
// problem, never the message's contents.
func (p *Provider) encode(key envelope.Key, msg *envelope.Message) ([]byte, error) {
	if msg == nil {
		return nil, errors.New("sink: nil message")
	}
	if msg.Channel != p.ch {
		return nil, fmt.Errorf("sink: %s message given to the %s sink", msg.Channel, p.ch)
	}
	switch p.ch {
	case envelope.ChannelEmail:
		if msg.Email == nil {
			return nil, errors.New("sink: email message without Email")
		}
		return render.EML(msg.Email, p.from, p.now(), messageID(key)), nil
	case envelope.ChannelPush:
		m := msg.Push
		if m == nil {
			return nil, errors.New("sink: push message without Push")
		}
		payload := json.RawMessage(m.Payload)
		if !json.Valid(m.Payload) {
			// Keep a non-JSON payload readable as a JSON string.
			b, err := json.Marshal(string(m.Payload))
			if err != nil {
				return nil, err
			}
			payload = b
		}
		return marshal(pushFile{
			Endpoint: m.Subscription.Endpoint,
			TTL:      int64(m.TTL / time.Second),
			Urgency:  m.Urgency,
			Topic:    m.Topic,
			Payload:  payload,
		})
	case envelope.ChannelTelegram:
		m := msg.Chat
		if m == nil {
			return nil, errors.New("sink: telegram message without Chat")
		}
		return marshal(chatFile{ChatID: m.ChatID, Text: m.Text, ParseMode: m.ParseMode, Segment: m.Segment, Segments: m.Segments})
	case envelope.ChannelWeCom, envelope.ChannelWeComRobot, envelope.ChannelWeComBotReply:
		m := msg.WeCom
		if m == nil {
			return nil, errors.New("sink: wecom message without WeCom")
		}
		// The response_url is a credential: not written.
		return marshal(weComFile{User: m.User, Agent: m.Agent, Robot: m.Robot, MsgType: m.MsgType, Content: m.Content, Segment: m.Segment, Segments: m.Segments})
	}
	return nil, fmt.Errorf("sink: unknown channel %q", p.ch)
}

// messageID is the Message-ID of key's e-mail: stable, so that a
// redelivery writes the same message, and opaque.
func messageID(key envelope.Key) string {
	return "<" + key.Hash() + "@outbox.localhost>"
}

// marshal encodes v as indented JSON without HTML escaping, for a person
// to read.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// writeAtomic writes data to name in dir the crash-safe way: a temporary
// file in dir (created exclusively), fsync, rename over name, fsync dir. A
// reader sees the old file or the new one, never a torn one. A link at
// name is refused (a rename would replace it; it is never written through).
func writeAtomic(dir *nofollow.Dir, name string, data []byte) (err error) {
	if st, err := dir.Lstat(name); err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return &nofollow.LinkError{Name: filepath.Join(dir.Name(), name)}
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	tmp := "." + name + "." + hex.EncodeToString(b[:]) + ".tmp"
	f, err := dir.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, filePerm)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = dir.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err = f.Chmod(filePerm); err != nil {
		_ = f.Close()
		return err
	}
	if err = f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = dir.Rename(tmp, name); err != nil {
		return err
	}
	return dir.Sync()
}

// JournalPath is the file Options.Journal appends to.
func (p *Provider) JournalPath() string { return p.dir + ".journal" }

func (p *Provider) appendJournal(key envelope.Key) error {
	p.jmu.Lock()
	defer p.jmu.Unlock()
	d, err := nofollow.OpenDir(p.dataDir, "sink", false, dirPerm)
	if err != nil {
		return fmt.Errorf("sink: %w", err)
	}
	defer d.Close()
	f, err := d.OpenFile(string(p.ch)+".journal", os.O_WRONLY|os.O_APPEND|os.O_CREATE, filePerm)
	if err != nil {
		return fmt.Errorf("sink: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(key.Hash() + "\n"); err != nil {
		return err
	}
	return f.Sync()
}
