package commit_test

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kscope-dev/kscope/commit"
)

func TestDoneMetadataRoundTrip(t *testing.T) {
	for _, d := range []commit.Done{
		{Offset: 7, End: 7},
		{Offset: 100, End: 110, Undone: []int64{103, 105}},
		{Offset: 0, End: 1 << 40, Undone: []int64{0, 1, 1 << 39}},
	} {
		got, err := commit.ParseDone(d.Offset, d.Metadata())
		if err != nil || !got.Equal(d) {
			t.Fatalf("ParseDone(Metadata(%+v)) = %+v, %v", d, got, err)
		}
	}
	// Metadata that is not kscope's says nothing is done above the offset;
	// kscope's, damaged, says the same and reports why.
	if got, err := commit.ParseDone(5, "written by another tool"); err != nil || !got.Equal(commit.Done{Offset: 5, End: 5}) {
		t.Fatalf("foreign metadata: %+v, %v", got, err)
	}
	meta := commit.Done{Offset: 5, End: 50, Undone: []int64{6, 7, 8}}.Metadata()
	if got, err := commit.ParseDone(5, meta[:len(meta)-2]); err == nil || !got.Equal(commit.Done{Offset: 5, End: 5}) {
		t.Fatalf("truncated metadata: %+v, %v", got, err)
	}
}

// A partition consumed from scratch commits its lowest unfinished record
// and lists the unfinished ones below the highest finished one.
func TestProgressOfAFreshAssignment(t *testing.T) {
	p := commit.NewPartition("t", 0)
	prior := commit.Done{Offset: 100, End: 100}
	if got := p.Progress(prior); !got.Equal(prior) {
		t.Fatalf("nothing added: %+v", got)
	}
	for o := int64(100); o < 110; o++ {
		p.Add(o, 0)
	}
	p.DoneAll([]int64{100, 101, 102, 104, 106, 107, 108, 109})
	want := commit.Done{Offset: 103, End: 110, Undone: []int64{103, 105}}
	if got := p.Progress(prior); !got.Equal(want) {
		t.Fatalf("Progress = %+v, want %+v", got, want)
	}
}

// After a crash, the next owner's progress keeps what the last commit said
// of the records it has not fetched yet.
func TestProgressKeepsThePriorStateBeyondWhatWasFetched(t *testing.T) {
	prior := commit.Done{Offset: 100, End: 200, Undone: []int64{150, 180}}
	p := commit.NewPartition("t", 0)
	var done []int64
	for o := int64(100); o <= 160; o++ {
		p.Add(o, 0)
		if o != 150 {
			done = append(done, o)
		}
	}
	p.DoneAll(done)
	want := commit.Done{Offset: 150, End: 200, Undone: []int64{150, 180}}
	if got := p.Progress(prior); !got.Equal(want) {
		t.Fatalf("Progress = %+v, want %+v", got, want)
	}
	p.Done(150)
	want = commit.Done{Offset: 180, End: 200, Undone: []int64{180}}
	if got := p.Progress(prior); !got.Equal(want) {
		t.Fatalf("after 150: Progress = %+v, want %+v", got, want)
	}
}

// Whatever finishes in whatever order, Progress says of every offset
// exactly what is true of it: done in this assignment, or, past what it
// fetched, done in the prior commit.
func TestProgressIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 2000 {
		start := int64(rng.IntN(50))
		prior := commit.Done{Offset: start, End: start + int64(rng.IntN(40))}
		for o := prior.Offset; o < prior.End; o++ {
			if rng.IntN(4) == 0 {
				prior.Undone = append(prior.Undone, o)
			}
		}
		p := commit.NewPartition("t", 0)
		fetched := int64(rng.IntN(60))
		truth := map[int64]bool{}
		var added []int64
		for o := start; o < start+fetched; o++ {
			if prior.IsDone(o) {
				p.Add(o, 0)
				p.Done(o) // skipped as done, as the runner does
				truth[o] = true
				continue
			}
			p.Add(o, 0)
			added = append(added, o)
		}
		rng.Shuffle(len(added), func(i, j int) { added[i], added[j] = added[j], added[i] })
		for _, o := range added[:rng.IntN(len(added)+1)] {
			p.Done(o)
			truth[o] = true
		}
		last := start + fetched - 1
		got := p.Progress(prior)
		if !slices.IsSorted(got.Undone) || len(got.Undone) > 0 && (got.Undone[0] < got.Offset || got.Undone[len(got.Undone)-1] >= got.End) {
			t.Fatalf("round %d: malformed %+v", round, got)
		}
		for o := int64(0); o < start+fetched+60; o++ {
			want := truth[o] || o < start
			if o > last {
				want = prior.IsDone(o)
			}
			if got.IsDone(o) != want {
				t.Fatalf("round %d: prior %+v, fetched up to %d: Progress %+v says offset %d done=%v, want %v",
					round, prior, last, got, o, got.IsDone(o), want)
			}
		}
	}
}

// kscopeMeta encodes uvarints as kscope1 metadata, well-formed or not.
func kscopeMeta(vs ...uint64) string {
	var b []byte
	for _, v := range vs {
		b = binary.AppendUvarint(b, v)
	}
	return "kscope1:" + base64.RawURLEncoding.EncodeToString(b)
}

// Metadata that kscope never writes (damaged, or another writer's under
// kscope's prefix) must claim no record done above the committed offset:
// undone offsets out of order, below the offset or past the end, or an end
// past the largest offset, are refused as damaged. Taken as they decoded,
// the next owner's progress committed past a record that was not done
// (the first case: offset 150 committed while 120 was undone, and 120 was
// never handled) or went back below the committed offset.
func TestParseDoneRefusesMetadataKscopeDoesNotWrite(t *testing.T) {
	const offset = 100
	back := func(n uint64) uint64 { return -n } // a gap that wraps below the previous offset
	for _, c := range []struct {
		name string
		meta string
	}{
		{"undone out of order", kscopeMeta(100, 2, 50, back(30))},
		{"undone below the offset", kscopeMeta(100, 1, back(50))},
		{"undone past the end", kscopeMeta(10, 1, 20)},
		{"the same undone twice", kscopeMeta(10, 2, 3, 0)},
		{"an end past the largest offset", kscopeMeta(math.MaxInt64, 0)},
		{"bytes after the offset", kscopeMeta(10, 1, 3, 100, 7)},
		{"no undone offsets after their count", kscopeMeta(10, 2, 3)},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := commit.ParseDone(offset, c.meta)
			if err == nil || !got.Equal(commit.Done{Offset: offset, End: offset}) {
				t.Fatalf("ParseDone = %+v, %v; want nothing done above %d, and an error", got, err, offset)
			}
		})
	}

	// What a damaged prior becomes in the next owner's commit.
	prior, _ := commit.ParseDone(offset, kscopeMeta(100, 2, 50, back(30)))
	p := commit.NewPartition("t", 0)
	for o := int64(offset); o <= 110; o++ {
		p.Add(o, 0)
		p.Done(o)
	}
	if next := p.Progress(prior); next.Offset > 120 && !prior.IsDone(120) {
		t.Fatalf("the prior %+v says 120 is not done; the next commit %+v passes it", prior, next)
	}
}

// Metadata names the offset it was written for: a tool that commits
// another offset with it (a script that reads the group's offsets with
// their metadata, changes the offsets and commits them back) does not
// make the next owner take the records at the old distances from the new
// offset for done. Read at 50, what was written at 100 with 150 undone
// said that 150 was done.
func TestParseDoneRefusesMetadataOfAnotherOffset(t *testing.T) {
	meta := commit.Done{Offset: 100, End: 200, Undone: []int64{150}}.Metadata()
	for _, at := range []int64{50, 99, 101, 120} {
		got, err := commit.ParseDone(at, meta)
		if err == nil || !got.Equal(commit.Done{Offset: at, End: at}) {
			t.Fatalf("metadata written at 100, committed at %d: ParseDone = %+v, %v; want nothing done above %d, and an error", at, got, err, at)
		}
	}
	// Metadata written before it named its offset still reads.
	old := kscopeMeta(100, 1, 50)
	if got, err := commit.ParseDone(100, old); err != nil || !got.Equal(commit.Done{Offset: 100, End: 200, Undone: []int64{150}}) {
		t.Fatalf("metadata without its offset: ParseDone = %+v, %v", got, err)
	}
}

// Whatever the metadata, ParseDone returns a well-formed Done for the
// offset it is given, and what Metadata writes reads back the same, at its
// own offset only.
func FuzzParseDone(f *testing.F) {
	f.Add(int64(100), commit.Done{Offset: 100, End: 110, Undone: []int64{103, 105}}.Metadata())
	f.Add(int64(0), commit.Done{Offset: 0, End: 1 << 40, Undone: []int64{0, 1, 1 << 39}}.Metadata())
	f.Add(int64(100), kscopeMeta(100, 2, 50, math.MaxUint64-29))
	f.Add(int64(7), "kscope1:")
	f.Add(int64(7), "another tool's")
	f.Fuzz(func(t *testing.T, offset int64, meta string) {
		if offset < 0 {
			return // nothing committed: the runner does not parse
		}
		none := commit.Done{Offset: offset, End: offset}
		d, err := commit.ParseDone(offset, meta)
		if err != nil && !d.Equal(none) {
			t.Fatalf("ParseDone(%d, %q) = %+v with error %v; want nothing done above the offset", offset, meta, d, err)
		}
		if d.Offset != offset || d.End < d.Offset || !slices.IsSorted(d.Undone) || len(slices.Compact(slices.Clone(d.Undone))) != len(d.Undone) ||
			len(d.Undone) > 0 && (d.Undone[0] < d.Offset || d.Undone[len(d.Undone)-1] >= d.End) {
			t.Fatalf("ParseDone(%d, %q) = %+v: malformed", offset, meta, d)
		}
		if d.End == d.Offset {
			return
		}
		again, err := commit.ParseDone(offset, d.Metadata())
		if err != nil || !again.Equal(d) {
			t.Fatalf("%+v does not read back: %+v, %v", d, again, err)
		}
		if offset == math.MaxInt64 {
			return
		}
		if other, _ := commit.ParseDone(offset+1, d.Metadata()); !other.Equal(commit.Done{Offset: offset + 1, End: offset + 1}) {
			t.Fatalf("%+v read at %d: %+v", d, offset+1, other)
		}
	})
}
