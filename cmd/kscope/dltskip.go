package main

import (
	"context"
	"flag"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/retrytopic"
)

// dltSkipUsage is dlt skip's synopsis, description and examples.
const dltSkipUsage = `
Usage:
  kscope dlt skip --group G (--partition P --offset O | --key K | --id ID) --reason "..." [--approve NAME]
                  [--scope db|at_least_once|kafka] [resolution flags]

Resolves dead letters without applying them: the records the selection
names (one offset, every dead letter of a key, or of an identity; the
--class, --from-offset and --to-offset filters narrow it) are given up for
good, and the reason is recorded.

  1. The audit log (the compacted topic kscope-audit, --audit-topic) gets
     one record: who ran it, who approved it (--approve), why, and each
     dead letter's partition, offset, identity and key (not its value).
     'kscope audit' lists it. Nothing else is done when it fails.
  2. The identities are marked resolved where the group's scope
     deduplicates, so that a replay of the source topic does not
     resurrect them:
       db             their inbox rows get status 'resolved' (rows the
                      inbox lost are written): the scope treats the
                      identity as done, even a copy carrying the
                      kscope-redrive header. The inbox TTL does not delete
                      resolved rows. Needs --database-url (or DATABASE_URL);
                      --inbox-consumer and --table-prefix as the scope's
                      Options say.
       at_least_once  with a dedupe store that outlives the processes
                      (--dedupe postgres with --database-url and
                      --dedupe-table, or --dedupe redis with --redis-url and
                      --redis-prefix), the identities are remembered there
                      for --dedupe-window under the group's key, as the
                      runner remembers what it handled: a replay within the
                      window skips them. Without one (--dedupe none or
                      memory) nothing outside the audit log remembers them.
       kafka          the Kafka scope keeps no dedupe state that can be
                      written from outside: a replay of the source topic
                      handles them again. Only the audit log and the
                      triage group remember the skip.
     The scope is --scope, else the group's entry in the policy file
     (--policy); --dedupe is, else, the entry's dedupe.
  3. Whatever the scope, 'kscope dlt redrive' passes over every dead letter
     of a skipped identity (it reads the audit log and says so on stderr),
     a redrive with --payload-file refuses it, and when the skipped dead
     letters are next in line for triage (no dead letter before them
     waits), the group <group>.kscope-triage is committed past them, so the
     gauge kscope_dead_letters_waiting and dlt list's count no longer
     count them. Skipped dead letters behind others that wait are counted
     until a redrive reaches them: it counts them handled.

The dead letters stay in the dead-letter topic (Kafka cannot delete single
records; see kscope dlt delete for a partition's prefix).

Examples:
  kscope dlt skip --group payments --partition 0 --offset 42 --reason "refunded by hand, ticket PAY-123" --scope db
  kscope --policy kscope-policy.yaml dlt skip --group payments --key order-42 --reason "order cancelled" --approve alice
`

func dltSkipCmd() *command {
	return &command{
		name:    "dlt skip",
		summary: "give dead letters up with a reason: audited, resolved against replays and redrives",
		usage:   dltSkipUsage,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			f := declareDLTFlags(fs, true)
			s := &skipOpts{}
			fs.Int64Var(&s.offset, "offset", -1, "the offset of the dead letter to skip (with --partition)")
			s.tf.declare(fs, "the dead letters are skipped")
			s.res.declare(fs, f.timeouts)
			return func(ctx context.Context) error { return dltSkip(ctx, e, f, s) }
		},
	}
}

// skipOpts are dlt skip's own flags.
type skipOpts struct {
	offset int64
	tf     triageFlags
	res    resolveOpts
}

// check checks the selection: a skip names its dead letters.
func (s *skipOpts) check(f *dltFlags) error {
	if *f.group == "" {
		return usagef("give the consumer group with --group: the skip is recorded, and the identities resolved, under it")
	}
	if s.offset >= 0 && *f.partition < 0 {
		return usagef("--offset %d needs --partition: offsets are per partition", s.offset)
	}
	if s.offset < 0 && !f.isSet("key") && *f.id == "" {
		return usagef("say which dead letters to skip: --partition P --offset O, --key K or --id ID (a skip of a whole topic is not taken)")
	}
	return s.tf.check("a skip")
}

// dltSkip runs dlt skip: it selects the dead letters, records them in the
// audit log, resolves their identities and commits the triage group past
// them when they are next in line.
func dltSkip(ctx context.Context, e *env, f *dltFlags, s *skipOpts) error {
	topic, err := f.dltTopic()
	if err != nil {
		return err
	}
	if err := s.check(f); err != nil {
		return err
	}
	rng, flt, err := f.selection()
	if err != nil {
		return err
	}
	group := *f.group
	rsv, err := s.res.resolver(e, group)
	if err != nil {
		return err
	}
	defer rsv.close()
	kc, cl, adm, err := e.kafkaAdmin(*f.brokers, f.timeouts)
	if err != nil {
		return err
	}
	defer cl.Close()
	resolved, err := readResolved(ctx, kc, adm, s.tf.auditTopic, group)
	if err != nil {
		return err
	}
	var picked []deadLetter
	ids := map[string]bool{}
	tr, complete, err := triagePass(ctx, kc, adm, group, topic, rng, func(r *kgo.Record, m retrytopic.Metadata, _ error) bool {
		if s.selects(r, m, rng, flt) || ids[m.ID] {
			picked = append(picked, deadLetter{r: r, m: m})
			ids[m.ID] = true
			return true
		}
		return resolved[m.ID] != ""
	})
	if err != nil {
		return err
	}
	if len(picked) == 0 {
		return fmt.Errorf("no dead letter of %s matches the selection; nothing was skipped (see kscope dlt list)", topic)
	}
	rec := newTriageAudit(e, actionSkip, group, topic, fmt.Sprintf("skip of %s (%s)", plural(len(picked), "dead letter"), plural(len(ids), "identity")), &s.tf, picked)
	if err := writeAudit(ctx, kc, adm, s.tf.auditTopic, rec); err != nil {
		return fmt.Errorf("%w; a skip is not made unaudited, so nothing was changed", err)
	}
	for _, d := range picked {
		fmt.Fprintf(e.stdout, "skipped partition %d offset %d (key %s, id %s)\n", d.r.Partition, d.r.Offset, cell(keyText(d.r.Key), listKeyWidth), d.m.ID)
	}
	note, err := rsv.resolve(ctx, sortedIDs(ids))
	if err != nil {
		return fmt.Errorf("%w; the audit record %s keeps the skip: a redrive passes over these dead letters; run the same command again to resolve them", err, rec.ID)
	}
	fmt.Fprintf(e.stdout, "skip: %s of %s recorded in %s (audit record %s); %s\n", plural(len(picked), "dead letter"), topic, s.tf.auditTopic, rec.ID, note)
	return commitPass(ctx, e, kc, adm, "skip", topic, tr, complete)
}

// selects reports whether the selection names r: the offset (with
// --partition), the filters (key, class, id) and the offset bounds.
func (s *skipOpts) selects(r *kgo.Record, m retrytopic.Metadata, rng scanRange, flt *recordFilter) bool {
	switch {
	case s.offset >= 0 && r.Offset != s.offset,
		rng.from >= 0 && r.Offset < rng.from,
		rng.to >= 0 && r.Offset > rng.to:
		return false
	}
	return flt.match(r, m)
}

// sortedIDs returns the identities of ids in order.
func sortedIDs(ids map[string]bool) []string {
	out := make([]string, 0, len(ids))
	for id := range ids {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}
