package main

import (
	"slices"
	"testing"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
)

// serve opens the store with unsynced claims for exactly the channels
// whose provider redelivers idempotently.
func TestIdempotentChannels(t *testing.T) {
	push := fake.New(envelope.ChannelPush)
	push.SetIdempotent(false)
	providers := map[envelope.Channel]channels.Provider{
		envelope.ChannelEmail:    fake.New(envelope.ChannelEmail),
		envelope.ChannelPush:     push,
		envelope.ChannelTelegram: fake.New(envelope.ChannelTelegram),
	}
	got := idempotentChannels(providers)
	if want := []envelope.Channel{envelope.ChannelEmail, envelope.ChannelTelegram}; !slices.Equal(got, want) {
		t.Fatalf("idempotentChannels = %v, want %v", got, want)
	}
	if got := idempotentChannels(nil); len(got) != 0 {
		t.Fatalf("idempotentChannels(nil) = %v, want none", got)
	}
}
