package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// deleteListMax bounds the identities the plan prints; the audit record
// lists them all.
const deleteListMax = 20

// dltDeleteUsage is dlt delete's synopsis, description and examples.
const dltDeleteUsage = `
Usage:
  kscope dlt delete --group G --partition P --before-offset O --approve NAME --reason "..." [--yes]

Deletes the dead letters of one partition before an offset: Kafka deletes
a partition's prefix only (DeleteRecords moves its start offset to O), not
single records. Every record of the partition below O goes, whatever its
class or key.

It refuses without --approve (exit status 2: deleting dead letters for good
needs an approver) and without --reason. It first prints what it would
delete: the offsets, the number of records and their identities. Without
--yes it stops there and deletes nothing.

With --yes it appends one record to the audit log (the compacted topic
kscope-audit, --audit-topic: who approved it, who ran it, why, and each
deleted dead letter's offset, identity and key, never its value), then
deletes the records, then commits the group <group>.kscope-triage past
them: they no longer count as waiting (kscope_dead_letters_waiting, dlt
list). A delete the log cannot take is not made. 'kscope audit' lists it.

The deleted records are gone for every reader of the topic; their
identities are not marked resolved: a replay of the source topic handles
them as it would have (use kscope dlt skip first to resolve them).

Examples:
  kscope dlt delete --group payments --partition 0 --before-offset 1200 --approve alice --reason "test data, INC-77"
  kscope dlt delete --group payments --partition 0 --before-offset 1200 --approve alice --reason "test data, INC-77" --yes
`

func dltDeleteCmd() *command {
	return &command{
		name:    "dlt delete",
		summary: "delete a partition's dead letters before an offset, with an approver: audited",
		usage:   dltDeleteUsage,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			f := declareDLTFlags(fs, false)
			d := &deleteOpts{}
			fs.Int64Var(&d.before, "before-offset", -1, "delete the records of --partition below this offset")
			fs.BoolVar(&d.yes, "yes", false, "delete them (without it, only what would be deleted is printed)")
			d.tf.declare(fs, "the dead letters are deleted")
			return func(ctx context.Context) error { return dltDelete(ctx, e, f, d) }
		},
	}
}

// deleteOpts are dlt delete's own flags.
type deleteOpts struct {
	before int64
	yes    bool
	tf     triageFlags
}

// check refuses a delete without an approver, and checks the flags.
func (d *deleteOpts) check(f *dltFlags) error {
	if *f.partition < 0 || d.before < 0 {
		return usagef("give the partition and the offset to delete before: --partition P --before-offset O (Kafka deletes a partition's prefix only)")
	}
	if strings.TrimSpace(d.tf.approve) == "" {
		return refusef("refused: deleting dead letters loses them for good, so it needs an approver; nothing was deleted. " +
			"Re-run with --approve NAME, naming who approved it: it is recorded in the audit log, which 'kscope audit' lists.")
	}
	return d.tf.check("a delete")
}

// dltDelete runs dlt delete: it reads what it would delete and prints it;
// with --yes it audits the delete, deletes the records and commits the
// triage group past them.
func dltDelete(ctx context.Context, e *env, f *dltFlags, d *deleteOpts) error {
	topic, err := f.dltTopic()
	if err != nil {
		return err
	}
	if err := d.check(f); err != nil {
		return err
	}
	rng, _, err := f.selection()
	if err != nil {
		return err
	}
	kc, cl, adm, err := e.kafkaAdmin(*f.brokers, f.timeouts)
	if err != nil {
		return err
	}
	defer cl.Close()
	bs, err := bounds(ctx, adm, kc, topic, rng)
	if err != nil {
		return err
	}
	p, b := rng.partition, bs[rng.partition]
	switch {
	case d.before > b.end:
		return usagef("--before-offset %d is past the end of %s partition %d (%d)", d.before, topic, p, b.end)
	case d.before <= b.begin:
		fmt.Fprintf(e.stdout, "delete: nothing to delete: %s partition %d starts at offset %d\n", topic, p, b.begin)
		return nil
	}
	rng.from, rng.to = b.begin, d.before-1
	var dls []deadLetter
	if _, err := scan(ctx, kc, adm, topic, rng, func(r *kgo.Record) error {
		m, _ := decode(r)
		dls = append(dls, deadLetter{r: r, m: m})
		return nil
	}); err != nil {
		return err
	}
	d.plan(e, topic, p, b.begin, dls)
	if !d.yes {
		fmt.Fprintln(e.stdout, "nothing deleted: re-run with --yes to delete them")
		return nil
	}
	return d.apply(ctx, e, kc, adm, *f.group, topic, p, dls)
}

// plan prints what the delete would delete.
func (d *deleteOpts) plan(e *env, topic string, p int32, begin int64, dls []deadLetter) {
	ids := map[string]bool{}
	var list []string
	for _, dl := range dls {
		if !ids[dl.m.ID] {
			ids[dl.m.ID] = true
			list = append(list, dl.m.ID)
		}
	}
	fmt.Fprintf(e.stdout, "delete: %s partition %d offsets %d to %d: %s, %s\n", topic, p, begin, d.before-1, plural(len(dls), "record"), plural(len(ids), "identity"))
	if len(list) > deleteListMax {
		list = append(list[:deleteListMax], fmt.Sprintf("and %d more (the audit record lists them all)", len(ids)-deleteListMax))
	}
	if len(list) > 0 {
		fmt.Fprintf(e.stdout, "identities: %s\n", strings.Join(list, ", "))
	}
}

// apply audits the delete, deletes the records and commits the triage
// group (with group) past them.
func (d *deleteOpts) apply(ctx context.Context, e *env, kc *kafkaConn, adm *kadm.Client, group, topic string, p int32, dls []deadLetter) error {
	auditGroup := cmpOr(group, strings.TrimSuffix(topic, ".kscope-dlt"))
	rec := newTriageAudit(e, actionDelete, auditGroup, topic, fmt.Sprintf("delete of partition %d before offset %d (%s)", p, d.before, plural(len(dls), "record")), &d.tf, dls)
	if err := writeAudit(ctx, kc, adm, d.tf.auditTopic, rec); err != nil {
		return fmt.Errorf("%w; a delete is not made unaudited, so nothing was deleted", err)
	}
	offsets := kadm.Offsets{}
	offsets.Add(kadm.Offset{Topic: topic, Partition: p, At: d.before, LeaderEpoch: -1})
	err := kc.do(ctx, func(ctx context.Context) error {
		resp, err := adm.DeleteRecords(ctx, offsets)
		if err == nil {
			err = resp.Error()
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("deleting the records of %s partition %d before offset %d (the audit record %s was written; run the same command again): %w", topic, p, d.before, rec.ID, err)
	}
	fmt.Fprintf(e.stdout, "deleted %s of %s partition %d before offset %d (audit record %s)\n", plural(len(dls), "record"), topic, p, d.before, rec.ID)
	if group == "" {
		fmt.Fprintln(e.stderr, "delete: nothing committed for triage (give --group)")
		return nil
	}
	tr, err := newTriage(ctx, adm, kc, group, topic, scanRange{partition: p, from: -1, to: -1})
	if err != nil {
		return err
	}
	tr.bounds = map[int32]partitionBounds{p: {begin: d.before, end: d.before}}
	tr.next[p] = d.before
	return commitPass(ctx, e, kc, adm, "delete", topic, tr, false)
}
