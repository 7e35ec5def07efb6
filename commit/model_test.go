package commit

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// watermarkModel is the watermark as a list: every added offset with its
// epoch and timestamp, and whether it finished.
type watermarkModel struct {
	offsets []int64
	epochs  []int32
	ts      []int64
	done    []bool
	head    int // the first unfinished offset's index
	commit  Offset
}

func (m *watermarkModel) add(o int64, epoch int32, ts int64) bool {
	if n := len(m.offsets); n > 0 && o <= m.offsets[n-1] {
		return false
	}
	m.offsets, m.epochs, m.ts, m.done = append(m.offsets, o), append(m.epochs, epoch), append(m.ts, ts), append(m.done, false)
	return true
}

func (m *watermarkModel) finish(o int64) bool {
	i, found := slices.BinarySearch(m.offsets, o)
	if !found || m.done[i] {
		return false
	}
	m.done[i] = true
	for m.head < len(m.offsets) && m.done[m.head] {
		m.commit = Offset{Epoch: m.epochs[m.head], Offset: m.offsets[m.head] + 1}
		m.head++
	}
	return true
}

func (m *watermarkModel) position() (next, ts int64, pending int, ok bool) {
	if len(m.offsets) == 0 {
		return 0, 0, 0, false
	}
	next = m.offsets[len(m.offsets)-1] + 1
	found := false
	for i := m.head; i < len(m.done); i++ {
		if !m.done[i] {
			pending++
			if !found {
				next, ts, found = m.offsets[i], m.ts[i], true
			}
		}
	}
	return next, ts, pending, true
}

// progress is Progress(Done{}) as its doc defines it: the committed offset
// is the lowest unfinished one (one past the last added when none is), the
// end one past the highest finished one (at least the committable offset
// and the committed one), and the unfinished offsets listed are those below
// the end. The offsets before head are finished and below m.commit.
func (m *watermarkModel) progress() Done {
	if len(m.offsets) == 0 {
		return Done{}
	}
	w, end := m.offsets[len(m.offsets)-1]+1, max(m.commit.Offset, 0)
	for i := m.head; i < len(m.offsets); i++ {
		if o := m.offsets[i]; m.done[i] {
			end = max(end, o+1)
		} else {
			w = min(w, o)
		}
	}
	end = max(end, w)
	var undone []int64
	for i := m.head; i < len(m.offsets); i++ {
		if o := m.offsets[i]; !m.done[i] && o < end {
			undone = append(undone, o)
		}
	}
	return Done{Offset: w, End: end, Undone: undone}
}

// TestWatermarkAgainstModel drives a watermark and the model with the same
// steps (offsets added one by one and in polls, with gaps and repeats,
// finished one by one and in batches, out of order, repeated and unknown,
// long enough for the watermark to compact and merge finished runs behind
// records held open) and compares every answer after every step. Under
// the race detector, which has nothing to watch in it (one goroutine), it
// runs one seed of each kind of held record instead of ten.
func TestWatermarkAgainstModel(t *testing.T) {
	seeds := uint64(10)
	if raceDetector {
		seeds = 3
	}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(seed, seed*31+7))
		p, m := NewPartition("t", 0), &watermarkModel{commit: Offset{Epoch: -1, Offset: -1}}
		var next int64
		var open []int64
		stuck := map[int64]bool{}
		epoch := int32(1)
		stuckOneIn := []int{0, 300, 5000}[seed%3] // how rarely an added offset is held open
		for step := range 2500 {
			switch r := rng.IntN(10); {
			case r == 0: // one offset added alone, maybe after a gap
				next += 1 + int64(rng.IntN(2))
				o := next - 1
				if got, want := p.AddTimed(o, epoch, o*10), m.add(o, epoch, o*10); got != want {
					t.Fatalf("seed %d step %d: AddTimed(%d) = %v, want %v", seed, step, o, got, want)
				}
				open = append(open, o)
			case r < 4: // a poll: some offsets seen before, gaps, a new epoch now and then
				if rng.IntN(50) == 0 {
					epoch++
				}
				var offs []int64
				for back := rng.IntN(3); back > 0 && next-int64(back) >= 0; back-- {
					offs = append(offs, next-int64(back))
				}
				for range 1 + rng.IntN(200) {
					next += 1 + int64(rng.IntN(3)/2)
					offs = append(offs, next-1)
				}
				e := epoch
				first := p.AddAll(len(offs), func(i int) (int64, int32, int64) { return offs[i], e, offs[i] * 10 })
				want := len(offs)
				for i, o := range offs {
					if m.add(o, e, o*10) {
						open = append(open, o)
						if stuckOneIn > 0 && rng.IntN(stuckOneIn) == 0 {
							stuck[o] = true // held open for a long while
						}
						if want == len(offs) {
							want = i
						}
					}
				}
				if first != want {
					t.Fatalf("seed %d step %d: AddAll added from %d, want %d", seed, step, first, want)
				}
			case r < 5 && len(open) > 0: // one offset, or a repeat, or an unknown one
				o := open[rng.IntN(len(open))] + int64(rng.IntN(3)) - 1
				if stuck[o] && rng.IntN(20) != 0 {
					continue
				}
				delete(stuck, o)
				if got, want := p.Done(o), m.finish(o); got != want {
					t.Fatalf("seed %d step %d: Done(%d) = %v, want %v", seed, step, o, got, want)
				}
			default: // a worker's batch: offsets in increasing order, a few repeated
				var batch []int64
				keep := open[:0]
				for _, o := range open {
					if !stuck[o] && rng.IntN(3) == 0 {
						batch = append(batch, o)
					} else if !m.done[mustIndex(m, o)] {
						keep = append(keep, o)
					}
				}
				open = keep
				if len(batch) > 0 && rng.IntN(4) == 0 {
					batch = append(batch, batch[0])
				}
				want := 0
				for _, o := range batch {
					if m.finish(o) {
						want++
					}
				}
				if got := p.DoneAll(batch); got != want {
					t.Fatalf("seed %d step %d: DoneAll counted %d, want %d", seed, step, got, want)
				}
			}
			gotC, gotOK := p.Committable()
			if wantOK := m.commit.Offset >= 0; gotOK != wantOK || (wantOK && gotC != m.commit) {
				t.Fatalf("seed %d step %d: committable %+v (%v), want %+v", seed, step, gotC, gotOK, m.commit)
			}
			n, ts, pending, ok := p.Position()
			wn, wts, wpending, wok := m.position()
			if n != wn || ts != wts || pending != wpending || ok != wok || p.Pending() != wpending {
				t.Fatalf("seed %d step %d: position %d %d %d %v (pending %d), want %d %d %d %v",
					seed, step, n, ts, pending, ok, p.Pending(), wn, wts, wpending, wok)
			}
			if got, want := p.Progress(Done{}), m.progress(); !got.Equal(want) {
				t.Fatalf("seed %d step %d: progress %+v, want %+v", seed, step, got, want)
			}
		}
	}
}

func mustIndex(m *watermarkModel, o int64) int {
	i, _ := slices.BinarySearch(m.offsets, o)
	return i
}
