package train

import (
	"io"
	"testing"
)

// TestDisabledValidationAllocatesNothing: validation's own activation
// sets (its batch and sequence length) are allocated only when validation
// runs; disabled, the activations are the training shape's alone, and
// enabled with a longer sequence they grow.
func TestDisabledValidationAllocatesNothing(t *testing.T) {
	act := func(enable bool, seq int) int64 {
		job := testJob(t, t.TempDir(), 1)
		job.Validation.Enable, job.Validation.SeqLen = enable, seq
		tr, err := New(job, testDevice(1), io.Discard, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		return tr.eng.Memory().ActivationBytes
	}
	long := 8 * testJob(t, t.TempDir(), 1).Training.SeqLen
	off, offLong, onLong := act(false, 0), act(false, long), act(true, long)
	if off != offLong {
		t.Errorf("validation disabled: %d activation bytes with its seq_len %d, %d without", offLong, long, off)
	}
	if onLong <= off {
		t.Errorf("validation enabled at seq_len %d: %d activation bytes, not more than training's %d", long, onLong, off)
	}
}
