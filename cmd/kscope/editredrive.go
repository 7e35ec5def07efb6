package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/retrytopic"
)

// editOpts are dlt redrive's flags for an edited redrive of one dead
// letter, and the audit log a redrive reads the skipped dead letters from.
type editOpts struct {
	file   string // --payload-file
	offset int64  // --offset
	tf     triageFlags
	// group is the audit record's group: --group, else the dead-letter
	// topic's name without ".kscope-dlt".
	group string
}

// declareEditFlags declares dlt redrive's --payload-file, --offset,
// --reason, --approve and --audit-topic.
func declareEditFlags(fs *flag.FlagSet) *editOpts {
	ed := &editOpts{}
	fs.StringVar(&ed.file, "payload-file", "", "redrive the one dead letter at --partition and --offset with the value read from this `FILE` (audited with both values)")
	fs.Int64Var(&ed.offset, "offset", -1, "with --payload-file: the offset of the dead letter to redrive")
	fs.StringVar(&ed.tf.reason, "reason", "", "with --payload-file: why the value is edited, recorded in the audit log (required)")
	fs.StringVar(&ed.tf.approve, "approve", "", "with --payload-file: who approved the edit (`NAME`), recorded in the audit log")
	fs.StringVar(&ed.tf.auditTopic, "audit-topic", defaultAuditTopic, "the audit log: an edited redrive is recorded there; a redrive passes over the dead letters 'kscope dlt skip' recorded there")
	return ed
}

// editRedrive runs dlt redrive --payload-file: it sends the one dead
// letter at --partition and --offset to its target as a redrive does, with
// the file's content as its value, after recording both values in the
// audit log; with --group, it commits the triage group past it when it is
// next in line.
func editRedrive(ctx context.Context, e *env, f *dltFlags, o *redriveOpts, ed *editOpts) error {
	topic, value, err := ed.check(f)
	if err != nil {
		return err
	}
	rng, _, err := f.selection()
	if err != nil {
		return err
	}
	retryTopic, err := o.retryTopic(*f.group)
	if err != nil {
		return err
	}
	by, err := o.auditor(e)
	if err != nil {
		return err
	}
	kc, err := e.kafka(*f.brokers, f.timeouts)
	if err != nil {
		return err
	}
	cl, err := kc.client(kgo.RecordPartitioner(redrivePartitioner()), kgo.RecordDeliveryTimeout(produceTimeout))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	rd := &redriver{e: e, o: o, kc: kc, adm: adm, cl: cl, topic: topic, retryTopic: retryTopic, by: by,
		checked: map[string]error{}, st: &redriveStats{perTopic: map[string]int{}}}
	ed.group = *f.group
	if ed.group == "" {
		ed.group = strings.TrimSuffix(topic, ".kscope-dlt")
	}
	d, tr, complete, err := ed.find(ctx, rd, *f.group, rng)
	if err != nil {
		return err
	}
	target, ok := rd.target(d.r, d.m, nil)
	if !ok {
		return fmt.Errorf("partition %d offset %d was not redriven: its source topic is unknown; redrive it with --to retry", d.r.Partition, d.r.Offset)
	}
	if err := rd.checkTarget(ctx, d.r, target); err != nil {
		return err
	}
	return ed.send(ctx, rd, d, value, target, tr, complete)
}

// check checks the flags of an edited redrive and reads the file: it
// returns the dead-letter topic and the edited value.
func (ed *editOpts) check(f *dltFlags) (string, []byte, error) {
	topic, err := f.dltTopic()
	if err != nil {
		return "", nil, err
	}
	if *f.partition < 0 || ed.offset < 0 {
		return "", nil, usagef("--payload-file redrives one dead letter: give its --partition and --offset (see kscope dlt list)")
	}
	if f.isSet("from-offset") || f.isSet("to-offset") || f.isSet("key") || f.isSet("class") || f.isSet("id") {
		return "", nil, usagef("--payload-file redrives the one dead letter at --partition and --offset: drop --from-offset, --to-offset, --key, --class and --id")
	}
	if err := ed.tf.check("an edited redrive"); err != nil {
		return "", nil, err
	}
	value, err := os.ReadFile(ed.file)
	if err != nil {
		return "", nil, usagef("cannot read --payload-file: %v", err)
	}
	return topic, value, nil
}

// find reads the dead letter's partition and returns the dead letter, and
// with group the triage run that counts it (and the dead letters skipped
// before it) handled. A dead letter kscope dlt skip resolved is refused.
func (ed *editOpts) find(ctx context.Context, rd *redriver, group string, rng scanRange) (deadLetter, *triage, bool, error) {
	var d deadLetter
	resolved := map[string]string{}
	if group != "" {
		var err error
		if resolved, err = readResolved(ctx, rd.kc, rd.adm, ed.tf.auditTopic, group); err != nil {
			return d, nil, false, err
		}
	}
	if rd.o.dryRun {
		group = ""
	}
	tr, complete, err := triagePass(ctx, rd.kc, rd.adm, group, rd.topic, rng, func(r *kgo.Record, m retrytopic.Metadata, _ error) bool {
		if r.Offset == ed.offset {
			d = deadLetter{r: r, m: m}
			return true
		}
		return resolved[m.ID] != ""
	})
	switch {
	case err != nil:
		return d, nil, false, err
	case d.r == nil:
		return d, nil, false, fmt.Errorf("partition %d of %s has no record at offset %d (deleted by retention or dlt delete, or a transaction marker): see kscope dlt list", rng.partition, rd.topic, ed.offset)
	case resolved[d.m.ID] != "":
		return d, nil, false, refusef("refused: partition %d offset %d (id %s) was skipped by kscope dlt skip (audit record %s): it is resolved and a DB-scope consumer would not apply it again; nothing was sent",
			d.r.Partition, d.r.Offset, d.m.ID, resolved[d.m.ID])
	}
	return d, tr, complete, nil
}

// send records the edit in the audit log, then produces the redriven
// record with the edited value and commits the triage run; a dry run says
// what it would send.
func (ed *editOpts) send(ctx context.Context, rd *redriver, d deadLetter, value []byte, target string, tr *triage, complete bool) error {
	e := rd.e
	what := fmt.Sprintf("partition %d offset %d (key %s, id %s) to %s with the edited value of %s (%s)",
		d.r.Partition, d.r.Offset, cell(keyText(d.r.Key), listKeyWidth), d.m.ID, target, ed.file, plural(len(value), "byte"))
	if rd.o.dryRun {
		fmt.Fprintf(e.stdout, "redrive: would send %s; dry run: nothing was sent\n", what)
		return nil
	}
	rec := newTriageAudit(e, actionRedriveEdited, ed.group, rd.topic, fmt.Sprintf("redrive of %d/%d to %s with an edited value", d.r.Partition, d.r.Offset, target), &ed.tf, []deadLetter{d})
	rec.Operator = rd.by
	rec.Payload = &auditPayload{Original: d.r.Value, Edited: value}
	if err := writeAudit(ctx, rd.kc, rd.adm, ed.tf.auditTopic, rec); err != nil {
		return fmt.Errorf("%w; an edit is not redriven unaudited, so nothing was sent", err)
	}
	out := redriveRecord(d.r, target, d.m, rd.by, time.Now())
	out.Value = value
	if err := rd.cl.ProduceSync(ctx, out).FirstErr(); err != nil {
		return fmt.Errorf("producing partition %d offset %d to %s: %w (the audit record %s says it was edited; run the same command again once the cause is fixed)", d.r.Partition, d.r.Offset, target, err, rec.ID)
	}
	fmt.Fprintf(e.stdout, "redrive: sent %s; audit record %s keeps both values\n", what, rec.ID)
	if tr.group == "" {
		return nil
	}
	return commitPass(ctx, e, rd.kc, rd.adm, "redrive", rd.topic, tr, complete)
}
