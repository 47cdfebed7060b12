package applog

// ReadComplete reads the log at path from off up to and including its last
// complete line, through ReadLines (the tests' view of a whole log; lines
// longer than MaxLine are left out).
func ReadComplete(path string, off int64) ([]byte, error) {
	return readAll(func(at int64) (Chunk, error) { return ReadLines(path, at) }, off)
}

// ReadComplete is the package's ReadComplete through the appender.
func (a *Appender) ReadComplete(rel string, off int64) ([]byte, error) {
	return readAll(func(at int64) (Chunk, error) { return a.ReadLines(rel, at) }, off)
}

func readAll(read func(int64) (Chunk, error), off int64) ([]byte, error) {
	var out []byte
	for at := off; ; {
		c, err := read(at)
		if err != nil {
			return nil, err
		}
		out = append(out, c.Data...)
		at += int64(len(c.Data))
		switch {
		case c.Long && c.LongEnd >= 0:
			at = c.LongEnd
		case !c.More:
			return out, nil
		}
	}
}
