package envelope

import (
	"encoding/json"
	"fmt"
	"regexp"
	"time"
)

// BotReplyWindow is how long a WeCom AI bot callback's response_url is
// usable after the callback.
const BotReplyWindow = time.Hour

var (
	// A WeCom userid: 1–64 bytes of letters, digits and _-@., starting with
	// a letter or a digit.
	weComUserPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$`)
	// An agentid.
	weComAgentPattern = regexp.MustCompile(`^[0-9]{1,10}$`)
	// A robot's name as configured on the server
	// (OUTBOX_WECOM_ROBOT_<NAME>_KEY, the name in lower case here).
	robotPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_]{0,31}$`)
)

// checkWeComRecipient checks that the recipient has what a wecom channel
// needs. Rules never quote the value: a response_url is a secret.
func checkWeComRecipient(c *problemList, ch Channel, r *Recipient) {
	switch ch {
	case ChannelWeCom:
		switch {
		case r.WeComUser == "":
			c.add("recipient.wecom_user", "required for channel wecom")
		case !weComUserPattern.MatchString(r.WeComUser):
			c.add("recipient.wecom_user", "must be a WeCom userid (1-64 letters, digits, _ - @ or ., starting with a letter or digit)")
		}
		if r.WeComAgent != "" && !weComAgentPattern.MatchString(r.WeComAgent) {
			c.add("recipient.wecom_agent", "must be an agentid (digits)")
		}
	case ChannelWeComRobot:
		switch {
		case r.Robot == "":
			c.add("recipient.robot", "required for channel wecom_robot (the name of a robot configured on the server)")
		case !robotPattern.MatchString(r.Robot):
			c.add("recipient.robot", "must be a robot name (1-32 lower-case letters, digits or _, starting with a letter or digit)")
		}
	case ChannelWeComBotReply:
		switch {
		case r.ResponseURL == "":
			c.add("recipient.response_url", "required for channel wecom_bot_reply")
		case len(r.ResponseURL) > MaxURLBytes:
			c.add("recipient.response_url", fmt.Sprintf("must be at most %d bytes", MaxURLBytes))
		case !validURL(r.ResponseURL, false):
			c.add("recipient.response_url", ruleHTTPSURL)
		}
	}
}

// checkBotReply checks a wecom_bot_reply envelope: its response_url is
// usable once within BotReplyWindow, so the envelope must expire within
// that window of its creation and its reply must fit one message.
func checkBotReply(c *problemList, e *Envelope, top map[string]json.RawMessage, failed map[string]bool) {
	if !failed["expires_at"] {
		switch {
		case e.ExpiresAt.IsZero():
			c.add("expires_at", "required for channel wecom_bot_reply (the response_url is valid one hour)")
		case !failed["created_at"] && !e.CreatedAt.IsZero() && e.ExpiresAt.Sub(e.CreatedAt) > BotReplyWindow:
			c.add("expires_at", "must be at most one hour after created_at for channel wecom_bot_reply (the response_url is valid one hour)")
		}
	}
	raw, ok := top["payload"]
	if !ok || e.Template != TemplateReply || !isJSONObject(raw) {
		return
	}
	var p ReplyPayload
	if json.Unmarshal(raw, &p) == nil && len(p.Text) > MaxWeComBotReplyBytes && len(p.Text) <= MaxReplyTextBytes {
		c.add("payload.text", fmt.Sprintf("must be at most %d bytes for channel wecom_bot_reply (one message: the response_url is single use)", MaxWeComBotReplyBytes))
	}
}
