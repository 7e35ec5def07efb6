package main

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// offsetMove is what kscope replay and kscope share reset share: the
// flags checked, the policy read, the plan and its blast radius reported,
// the policy's gate, then the move. The callbacks are each command's own.
type offsetMove struct {
	usage string // the usage error without --group or --topic
	plan  func(ctx context.Context, kc *kafkaConn, adm *kadm.Client, at time.Time) (map[int32]*replayPlan, error)
	// again, when set, notes on the report what consuming the records
	// again means (replay); called when the plan moves any back.
	again  func(rep *replayReport)
	print  func(desc string, plan map[int32]*replayPlan, rep *replayReport)
	finish func(ctx context.Context, kc *kafkaConn, adm *kadm.Client, plan map[int32]*replayPlan, rep *replayReport) error
}

// runMove runs m with o's flags.
func runMove(ctx context.Context, e *env, o *replayOpts, m offsetMove) error {
	if o.group == "" || o.topic == "" {
		return usagef("%s", m.usage)
	}
	if err := o.checkSafetyFlags(); err != nil {
		return err
	}
	desc, at, err := o.target()
	if err != nil {
		return err
	}
	pol, err := e.replayPolicy(o.group)
	if err != nil {
		return err
	}
	kc, cl, adm, err := e.kafkaAdmin(o.brokers, o.timeouts)
	if err != nil {
		return err
	}
	defer cl.Close()
	plan, err := m.plan(ctx, kc, adm, at)
	if err != nil {
		return err
	}
	rep := newReplayReport(o, desc, plan)
	rep.Policy = pol.note
	if rep.Again > 0 {
		if m.again != nil {
			m.again(rep)
		}
		if rep.Blast, err = o.blast(ctx, e, kc, adm, plan, pol.entry); err != nil {
			return err
		}
	}
	if !o.asJSON {
		m.print(desc, plan, rep)
	}
	if err := pol.gate(o, rep); err != nil {
		if o.asJSON {
			rep.say(e, o, err.Error())
		}
		return err
	}
	return m.finish(ctx, kc, adm, plan, rep)
}
