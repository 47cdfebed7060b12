package filestore

// faultHook, set only by tests (a child process that kills itself there),
// is called at the named points of operations whose crash safety they
// check; nil in production.
var faultHook func(point string)

func faultAt(point string) {
	if faultHook != nil {
		faultHook(point)
	}
}
