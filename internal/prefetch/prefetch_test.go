package prefetch

import "testing"

func TestBytesTakesAnySlice(t *testing.T) {
	big := make([]byte, 1<<20)
	for _, b := range [][]byte{nil, {}, {1}, big, big[len(big)-1:], big[len(big):]} {
		Bytes(b)
	}
}

func TestBytesDoesNotMoveItsSliceToTheHeap(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() {
		var b [64]byte
		Bytes(b[:])
	}); n != 0 {
		t.Fatalf("Bytes allocated %v times a call; its argument escapes", n)
	}
}

func BenchmarkBytes(b *testing.B) {
	buf := make([]byte, 64<<20)
	for i := 0; b.Loop(); i++ {
		Bytes(buf[(i*4096)%len(buf):])
	}
}
