package gemm

import (
	"bufio"
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/testenv"
)

// TestEVEXEncodings: the instructions asmgen.go writes as bytes, because
// the Go assembler does not know them (VDPBF16PS, VCVTNE2PS2BF16,
// VCVTNEPS2BF16), are the bytes GNU as assembles from their mnemonics,
// which asmgen writes beside them.
func TestEVEXEncodings(t *testing.T) {
	as, err := exec.LookPath("as")
	testenv.Require(t, "GNU as (binutils)", err == nil)
	f, err := os.Open("kernels_amd64.s")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	line := regexp.MustCompile(`^\s*((?:BYTE \$0x[0-9a-f]{2}; )*BYTE \$0x[0-9a-f]{2}) // (\S+) (.*) \(Intel order\)$`)
	byteRe := regexp.MustCompile(`\$0x([0-9a-f]{2})`)
	var want []byte
	var src strings.Builder
	src.WriteString(".intel_syntax noprefix\n")
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			if strings.Contains(sc.Text(), "BYTE") {
				t.Fatalf("unrecognised BYTE line %q", sc.Text())
			}
			continue
		}
		ins := strings.ToLower(m[2]) + " " + strings.NewReplacer("Z", "zmm", "Y", "ymm").Replace(m[3])
		if seen[ins] {
			continue
		}
		seen[ins] = true
		for _, b := range byteRe.FindAllStringSubmatch(m[1], -1) {
			v, _ := strconv.ParseUint(b[1], 16, 8)
			want = append(want, byte(v))
		}
		src.WriteString(ins + "\n")
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(seen) < 10 {
		t.Fatalf("found only %d encoded instructions", len(seen))
	}
	dir := t.TempDir()
	in, obj := filepath.Join(dir, "evex.s"), filepath.Join(dir, "evex.o")
	if err := os.WriteFile(in, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(as, "-o", obj, in).CombinedOutput(); err != nil {
		t.Fatalf("as: %v\n%s", err, out)
	}
	ef, err := elf.Open(obj)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	got, err := ef.Section(".text").Data()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("asmgen's encodings differ from GNU as's:\nasmgen % x\nas     % x\nsource:\n%s", want, got, src.String())
	}
	t.Logf("%d distinct encodings agree with GNU as", len(seen))
}
