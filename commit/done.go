package commit

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// MaxUndone bounds the records of one partition that a transactional
// runner has dispatched and not finished. Records of a partition finish out
// of order (another key's record may retry in place while later ones
// commit), and the offset committed for a partition cannot pass its lowest
// unfinished record; so that the records finished after it are not handled
// again after a crash, a transactional commit also records, in the
// offset's metadata, which records above the offset are unfinished ([Done]).
// Bounding them keeps that metadata to a few kilobytes, below the broker's
// offset.metadata.max.bytes (4096 by default): 256 offsets take at most
// 3.5 kB, whatever the gaps between them. The metadata lists every
// unfinished record below the highest finished one, so the bound holds
// only while nothing the last commit did not already list as finished
// counts as finished above a record the runner holds back (past this
// bound, or until its due time): the runner therefore counts a
// transaction marker finished only once the records before it are
// dispatched.
const MaxUndone = 256

// Done is what a transactional commit records for one partition: every
// record below Offset is done, and so is every record in [Offset, End)
// except the Undone ones (sorted, each in [Offset, End)). Offset is the
// committed offset; the rest travels in the offset's metadata
// ([Done.Metadata]), so that the partition's next owner skips the records
// whose outputs are already committed.
type Done struct {
	Offset int64
	End    int64
	Undone []int64
}

// metaPrefix starts the offset metadata kscope writes: the version of the
// encoding that follows.
const metaPrefix = "kscope1:"

// Metadata encodes d's records done above Offset as offset commit
// metadata: uvarints of End-Offset, len(Undone), the gaps between Offset
// and the undone offsets, and Offset itself, in base64. It is empty when
// nothing above Offset is done.
//
// The offset comes last so that it reads as the metadata's own: a tool
// that commits another offset with this metadata (a script that reads a
// group's offsets with their metadata, moves them and commits them back)
// does not make ParseDone take the records at the same distances from the
// new offset for done. (Metadata written before the offset was added
// still reads; readers that predate it ignore it.)
func (d Done) Metadata() string {
	if d.End <= d.Offset {
		return ""
	}
	b := binary.AppendUvarint(nil, uint64(d.End-d.Offset))
	b = binary.AppendUvarint(b, uint64(len(d.Undone)))
	prev := d.Offset
	for _, u := range d.Undone {
		b = binary.AppendUvarint(b, uint64(u-prev))
		prev = u
	}
	b = binary.AppendUvarint(b, uint64(d.Offset))
	return metaPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// ParseDone decodes what [Done.Metadata] wrote for committed offset
// offset. Metadata that kscope did not write (another tool's, or none)
// means nothing above offset is done; so does metadata that does not
// decode to what Metadata writes, which is also reported as an error:
// undone offsets out of order or outside [offset, End), an End past the
// largest offset, bytes after the offset, or metadata written for another
// offset. Whatever meta holds, what ParseDone returns never says more
// than the metadata kscope wrote for offset said.
func ParseDone(offset int64, meta string) (Done, error) {
	none := Done{Offset: offset, End: offset}
	if !strings.HasPrefix(meta, metaPrefix) {
		return none, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(meta[len(metaPrefix):])
	if err != nil {
		return none, err
	}
	errTruncated := errors.New("truncated")
	next := func() (uint64, error) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, errTruncated
		}
		b = b[n:]
		return v, nil
	}
	span, err := next()
	if err != nil {
		return none, err
	}
	if offset < 0 {
		return none, fmt.Errorf("offset %d: no offset is committed", offset)
	}
	if span > uint64(math.MaxInt64-offset) {
		return none, fmt.Errorf("the records done above offset %d end past the largest offset", offset)
	}
	n, err := next()
	if err != nil || n > uint64(len(b)) {
		return none, errTruncated
	}
	d := Done{Offset: offset, End: offset + int64(span)}
	prev := offset
	for i := range n {
		gap, err := next()
		if err != nil {
			return none, err
		}
		// Each undone offset lies past the one before (the first may
		// be the committed offset itself) and before End.
		if (i > 0 && gap == 0) || gap >= uint64(d.End-prev) {
			return none, errors.New("the undone offsets are out of order or outside the records done")
		}
		prev += int64(gap)
		d.Undone = append(d.Undone, prev)
	}
	if len(b) == 0 {
		return d, nil // written before the metadata named its offset
	}
	at, err := next()
	if err != nil {
		return none, err
	}
	if at != uint64(offset) {
		return none, fmt.Errorf("the metadata was written for offset %d, not %d: a tool committed another offset with it", at, offset)
	}
	if len(b) > 0 {
		return none, errors.New("bytes after the offset")
	}
	return d, nil
}

// IsDone reports whether d says offset o is done.
func (d Done) IsDone(o int64) bool {
	return o < d.Offset || (o < d.End && !slices.Contains(d.Undone, o))
}

// Equal reports whether d and e say the same.
func (d Done) Equal(e Done) bool {
	return d.Offset == e.Offset && d.End == e.End && slices.Equal(d.Undone, e.Undone)
}

// Progress returns what a transactional commit records for the partition
// now: the assignment's finished and unfinished records, on top of prior,
// what was committed before the assignment consumed from prior.Offset
// (records past the last one added keep their state in prior). The
// committed offset is the lowest unfinished record; the metadata lists the
// unfinished records between it and the highest finished one.
func (p *Partition) Progress(prior Done) Done {
	p.mu.Lock()
	defer p.mu.Unlock()
	last := p.lastAdd
	if last < 0 {
		return prior
	}
	var undone []int64
	end := prior.End
	if p.commit.Offset >= 0 {
		end = max(end, p.commit.Offset)
	}
	for i := p.head; i < len(p.entries); i++ {
		if e := &p.entries[i]; p.isDone(i) {
			end = max(end, e.last()+1)
		} else {
			undone = append(undone, e.offset)
		}
	}
	for _, u := range prior.Undone {
		if u > last {
			undone = append(undone, u)
		}
	}
	w := max(last+1, prior.End)
	if len(undone) > 0 {
		w = min(w, undone[0])
	}
	end = max(end, w)
	i := 0
	for i < len(undone) && undone[i] < end {
		i++
	}
	return Done{Offset: w, End: end, Undone: undone[:i:i]}
}
