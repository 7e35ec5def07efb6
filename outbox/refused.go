package outbox

import (
	"context"
	"errors"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Rows Kafka refuses: searching for the refused row, moving it to the
// dead-letter table, and the stuck state of a partition whose topic cannot
// take its rows.

// refusal is a row Kafka refused for good, and its answer.
type refusal struct {
	seq int64
	err error
}

// refusalsToDeadLetter is how many times in a row a row must be refused
// alone before it is dead-lettered: a refusal that a broker gives once (a
// corrupted request) is not taken for the row's.
const refusalsToDeadLetter = 3

// failed takes in a transaction of batch that did not commit (err; the
// producer's answer for each row in rowErrs) and reports whether to back
// off before the next. A row that Kafka refuses as a record is searched
// for with smaller transactions, without backing off, until it is refused
// alone, when it is tried again after a backoff, up to
// refusalsToDeadLetter times. A row whose topic is missing, refused to the
// relay or refuses its timestamps makes the partition stuck, reported at
// ERROR with what to do: that is not the row's fault, and the row is
// published once fixed.
func (pub *publisher) failed(log *slog.Logger, batch []row, rowErrs []error, err error) (backOff bool) {
	refused, blocked := -1, -1
	for i, e := range rowErrs {
		if refused < 0 && refusedRecord(e) {
			refused = i
		}
		if _, ok := topicProblem(e); blocked < 0 && ok {
			blocked = i
		}
	}
	switch {
	case refused >= 0 && (blocked < 0 || refused < blocked) && len(batch) > 1:
		// franz-go does not split a batch the broker refused (too large,
		// say): every record of it fails alike, so the refusal names no
		// row. The rows before the first refused one were not refused;
		// from it on, fewer rows at a time until one is refused alone.
		if refused > 0 {
			pub.probe = refused
		} else {
			pub.probe = max(1, len(batch)/2)
		}
		log.Warn("kscope: outbox relay: Kafka refused a record of the transaction; publishing fewer rows per transaction to find the row it refuses",
			"first_refused", pub.ident(batch[refused]), "rows", len(batch), "next_rows", pub.probe, "err", rowErrs[refused])
		return false
	case refused == 0: // alone
		w := batch[0]
		if pub.lone.seq != w.seq {
			pub.lone.seq, pub.lone.n = w.seq, 0
		}
		pub.lone.n++
		if pub.lone.n >= refusalsToDeadLetter {
			pub.doomed = &refusal{seq: w.seq, err: rowErrs[0]}
		}
		log.Warn("kscope: outbox relay: Kafka refused a row sent alone; it is moved to the dead-letter table if that goes on",
			"id", pub.ident(w), "topic", w.topic, "bytes", len(w.key)+len(w.value)+len(w.headers),
			"refusals", pub.lone.n, "dead_letter_after", refusalsToDeadLetter, "err", rowErrs[0])
		return true
	case blocked >= 0:
		w := batch[blocked]
		advice, _ := topicProblem(rowErrs[blocked])
		if blocked > 0 {
			pub.probe = blocked // the rows before it go out meanwhile
		}
		pub.setStuck(true)
		pub.stuckAt = w.seq
		if held, ok := pub.stuckLog.allow(); ok {
			log.Error("kscope: outbox relay: the partition cannot be published: "+advice+
				". Nothing is skipped: the relay retries the row, and the rows after it wait, until this is fixed. This is logged every 30 seconds meanwhile",
				"id", pub.ident(w), "topic", w.topic, "err", rowErrs[blocked], "attempts_since_last_log", held+1)
		} else {
			log.Debug("kscope: outbox relay: the partition is still stuck", "topic", w.topic, "err", rowErrs[blocked])
		}
		return blocked == 0 // the rows before it go out at once
	}
	log.Warn("kscope: outbox relay: the transaction did not commit, or its end was not confirmed; publishing again from the partition's committed position", "err", err)
	return true
}

// deadLettered counts and logs the move of head, the partition's head
// row, to the dead-letter table (dead says why).
func (pub *publisher) deadLettered(log *slog.Logger, dead *refusal, head row) {
	r := pub.r
	pub.doomed = nil
	r.deadLettered.Add(1)
	if held, ok := pub.deadLog.allow(); ok {
		log.Error("kscope: outbox relay: a row can never be published (Kafka refused it alone, again and again: too large for the producer or the topic, "+
			"or a record the broker rejects; or its topic name is not one Kafka allows); it was moved to the dead-letter table, and the partition goes on with the rows after it. "+
			"See it with 'kscope outbox dead show <id>'; once the cause is fixed (the topic's max.message.bytes and the relay's kgo.ProducerBatchMaxBytes raised above its size), "+
			"publish it again with 'kscope outbox dead requeue <id>' (with --topic NAME for a topic name Kafka does not allow), which keeps its identity so that a consumer that saw it drops the copy, "+
			"or drop it with 'kscope outbox dead discard <id>'. "+
			"At most one such line is logged every 30 seconds",
			"id", pub.ident(head), "topic", head.topic,
			"bytes", len(head.key)+len(head.value)+len(head.headers), "table", r.o.TablePrefix+"outbox_dead", "err", dead.err,
			"dead_lettered_since_last_log", held+1)
	}
}

// committed takes in a committed transaction up to last: it widens the
// transactions again after a refused row, and ends a stuck state once
// past the row that caused it.
func (pub *publisher) committed(log *slog.Logger, last int64) {
	r := pub.r
	if pub.probe > 0 {
		if pub.probe *= 2; pub.probe >= r.o.BatchSize {
			pub.probe = 0
		}
	}
	pub.lone.seq, pub.lone.n = 0, 0
	if pub.stuck.Load() && last >= pub.stuckAt {
		pub.setStuck(false)
		pub.stuckLog = throttle{}
		log.Info("kscope: outbox relay: the partition is published again")
	}
}

// setStuck records whether the partition is stuck, for Stats.
func (pub *publisher) setStuck(on bool) {
	if pub.stuck.Swap(on) != on {
		if on {
			pub.r.stuck.Add(1)
		} else {
			pub.r.stuck.Add(-1)
		}
	}
}

// batch returns the rows of the next transaction: at most probe of them
// while a refused row is searched for, none from a row to a topic name
// Kafka does not allow on (it is dead-lettered once at the head), and a
// row the producer surely refuses (larger on its own than its
// ProducerBatchMaxBytes for the topic, maxBytes) alone, so that the
// refusal is its own.
func (pub *publisher) batch(rows []row, maxBytes func(string) int32) []row {
	if pub.probe > 0 && pub.probe < len(rows) {
		rows = rows[:pub.probe]
	}
	for i, w := range rows {
		if !ValidTopic(w.topic) || maxBytes != nil && len(w.key)+len(w.value)+len(w.headers) > int(maxBytes(w.topic)) {
			if i == 0 {
				return rows[:1]
			}
			return rows[:i]
		}
	}
	return rows
}

// refusedRecord reports whether err is Kafka refusing a record as such: too
// large for the producer or the topic, or a record the broker rejects.
// Whether it is the record's own fault or that of another in its batch
// takes sending it alone to tell.
func refusedRecord(err error) bool {
	for _, e := range []error{kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord, kerr.CorruptMessage, kerr.InvalidTopicException} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// topicProblem reports whether err is a reason that a record cannot be
// published now that is not the record's fault, and says what to do.
func topicProblem(err error) (advice string, ok bool) {
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		return "the topic does not exist; create it, or let the relay's producer create topics (kgo.AllowAutoTopicCreation() in Options.ClientOptions, with auto.create.topics.enable on the brokers)", true
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return "the broker refuses this relay the topic; grant this client Write on it", true
	case errors.Is(err, kerr.InvalidTimestamp):
		// The relay leaves the timestamp to the producer (the time it
		// publishes): a broker that refuses it disagrees with the relay's
		// clock, whatever the row.
		return "the broker refuses the records' timestamps (the relay's clock, when it publishes); bring the relay's clock in line with the brokers', or widen the topic's message.timestamp.before.max.ms and message.timestamp.after.max.ms", true
	}
	return "", false
}

// deadLetter moves w from the outbox to the dead-letter table, with why
// Kafka refuses it and the identity the row holds (a requeued row keeps
// its original one), in one statement: once it is dead, the outbox no
// longer holds it, so neither a relay that reads the partition again nor
// one that takes it over publishes it, and a Requeue of it is the one
// copy published. A row there already is left as it is (one a relay of
// an earlier version dead-lettered without deleting it). A missing table
// or column is reported as a *dbscope.SchemaError, which says to run
// Migrate.
func (pub *publisher) deadLetter(ctx context.Context, w row, why error) error {
	r := pub.r
	p := r.o.TablePrefix
	_, err := r.o.Pool.Exec(ctx, `WITH gone AS (
			DELETE FROM `+p+`outbox WHERE outbox = $1 AND partition = $2 AND seq = $3
			RETURNING outbox, partition, seq, topic, key, value, headers, created_at, id)
		INSERT INTO `+p+`outbox_dead (outbox, partition, seq, topic, key, value, headers, created_at, error, id)
		SELECT outbox, partition, seq, topic, key, value, headers, created_at, $4, id FROM gone
		ON CONFLICT (outbox, partition, seq) DO NOTHING`,
		r.o.Outbox, int32(pub.p), w.seq, why.Error())
	return schemaErr(ctx, r.o.Pool, r.o.TablePrefix, err)
}
