package main

import (
	"context"
	"fmt"
)

// cpuPerRecordTarget is cpu_per_record's target: kscope's AtLeastOnce
// no-op pipeline spends at most 1.3 times the CPU per record of the raw
// franz-go poll loop (the moonshot is 1.1).
const cpuPerRecordTarget = 1.3

// cpuPairOf pairs a's CPU per record with b's, round by round: the bench
// process's CPU (user and system, getrusage) over each run's window, the
// one its rate is timed over (start-up and stop left out), divided by the
// window's records. On Apache Kafka the broker is another process, so it
// is the consumer's alone. The pairing's wholeRun is the same ratio over
// whole runs, start-up and stop included.
func cpuPairOf(a, b figure) *pairing {
	p := &pairing{}
	if len(a.runs) != len(b.runs) || len(a.runs) == 0 {
		return p
	}
	var as, bs, wholes []float64
	for i := range a.runs {
		p.rounds = append(p.rounds, a.runs[i].cpuPerRecord()/b.runs[i].cpuPerRecord())
		as, bs = append(as, a.runs[i].cpuPerRecord()), append(bs, b.runs[i].cpuPerRecord())
		wholes = append(wholes, a.runs[i].wholeCPUPerRecord()/b.runs[i].wholeCPUPerRecord())
	}
	p.ratio = median(p.rounds)
	p.byMedians = median(as) / median(bs)
	p.wholeRun = median(wholes)
	return p
}

// cpuPerRecord returns the run's CPU per record over its window, or over
// the whole run when the window did not open.
func (r result) cpuPerRecord() float64 {
	if r.windowCPU > 0 {
		return float64(r.windowCPU) / float64(max(r.records, 1))
	}
	return r.wholeCPUPerRecord()
}

// wholeCPUPerRecord returns the run's CPU from its start to its stop over
// the records of its window: what cpu_per_record read before it was timed
// over the window.
func (r result) wholeCPUPerRecord() float64 {
	return float64(r.benchCPU) / float64(max(r.records, 1))
}

// cpuPerRecord reports cpu_per_record from r1's rounds on Apache Kafka
// (figs: kscope's no-op pipeline, then the raw loop), and profiles
// kscope's side, c, while the broker still runs when the target is missed.
func (ab *bench) cpuPerRecord(ctx context.Context, rep *report, figs []figure, c contender) error {
	s := scenario{key: "cpu_per_record", title: "CPU per record: kscope AtLeastOnce (no-op) against the raw franz-go poll loop (Apache Kafka)",
		figs: figs, pair: cpuPairOf(figs[0], figs[1]), target: cpuPerRecordTarget, cpu: true}
	s.ratio = s.pair.ratio
	if !s.met() {
		ab.logf("cpu_per_record missed its target: profiling one more run")
		prof, err := ab.profileRun(ctx, c)
		if err != nil {
			return fmt.Errorf("profiling cpu_per_record: %w", err)
		}
		s.profileText = prof
	}
	rep.add(s)
	return nil
}
