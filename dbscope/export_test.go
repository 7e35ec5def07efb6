package dbscope

// InboxInserts returns how many batches of r wrote their inbox rows with
// the plain insert, and how many of those met an id already in the inbox.
func InboxInserts(r *Runner) (plain, conflicts int64) {
	return r.s.inbox.plain.Load(), r.s.inbox.conflicts.Load()
}
