package retrytopic

// HeaderOwner names the team that owns the consumer group that routed a
// record, and how to reach it ("team <contact>", consumer.Config.Owner),
// so that whoever finds the record in a dead-letter topic knows whom it
// concerns. A record routed by a group without an owner carries none.
const HeaderOwner = "kscope-owner"

// MaxOwnerLength bounds the owner a header carries; a longer one is cut.
const MaxOwnerLength = 256

// TriageGroup returns the consumer group under which kscope dlt redrive
// commits, per partition of group's dead-letter topic, the offset past the
// dead letters it has handled: "<group>.kscope-triage". A dead letter is
// waiting (DeadLettersWaiting) until this group's committed offset passes
// it.
func TriageGroup(group string) string { return group + ".kscope-triage" }

// owner reads the record's owner.
func (d *headerDecoder) owner(m *Metadata) {
	if v, ok := d.header(HeaderOwner); ok {
		m.Owner = truncate(string(v), MaxOwnerLength)
	}
}
