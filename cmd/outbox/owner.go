package main

import (
	"fmt"
	"os"
	"os/user"
	"strconv"

	"github.com/outboxhq/outbox/queue/filestore"
)

// checkOwner refuses to write into the store in dir from a process of
// another user than the one its files belong to (root included): what it
// would create there (a log, a tenant directory, the index's mark) would be
// that user's, mode 0600, and the store's own serve could not read it: an
// envelope acknowledged as queued would never be delivered. A directory
// without a store yet is anyone's.
func checkOwner(dir string) error {
	owner, ok := filestore.Owner(dir)
	if me := os.Geteuid(); ok && owner != me {
		return fmt.Errorf("the store in %s belongs to user %s, and this command runs as %s: what it would write there could not be read by the store's own processes; run it as that user (sudo -u %s outbox …)",
			dir, userName(owner), userName(me), sudoName(owner))
	}
	return nil
}

func userName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return fmt.Sprintf("%s (uid %d)", u.Username, uid)
	}
	return fmt.Sprintf("uid %d", uid)
}

func sudoName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return u.Username
	}
	return "'#" + strconv.Itoa(uid) + "'"
}
