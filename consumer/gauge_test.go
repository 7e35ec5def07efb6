package consumer_test

import "sync/atomic"

type gauge struct{ cur, hi atomic.Int64 }

func newGauge() *gauge { return new(gauge) }

func (g *gauge) add(d int64) int64 {
	n := g.cur.Add(d)
	for {
		h := g.hi.Load()
		if n <= h || g.hi.CompareAndSwap(h, n) {
			return n
		}
	}
}

func (g *gauge) peak() int64 { return g.hi.Load() }
