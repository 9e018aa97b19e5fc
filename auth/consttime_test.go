package auth

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// Functions that compare secrets, and who must call them. Renaming one of
// these makes the test fail, which is the point: the list is reviewed.
var (
	secretCompareFuncs = []string{"trafficTokenEqual", "SameTrafficToken", "AdminAuthorized", "Signer.macValid", "Signer.VerifyCookie"}
	secretCallers      = map[string]string{"CheckTraffic": "trafficTokenEqual", "Signer.VerifyBytes": "macValid", "Signer.VerifyCookie": "VerifyBytes"}
	// Every function that holds a secret in a variable: no plain comparison allowed.
	secretHandlingFuncs = []string{"trafficTokenEqual", "SameTrafficToken", "AdminAuthorized", "Signer.macValid",
		"CheckTraffic", "PresentedTrafficToken", "Signer.Verify", "Signer.VerifyBytes",
		"Signer.VerifyCookie", "Signer.CookieValue", "Signer.binding"}
)

// TestSecretsComparedInConstantTime reads the package's own source: each
// secret compare calls crypto/subtle.ConstantTimeCompare, the entry points go
// through them, and no function handling a secret uses ==, != or an
// Equal/Compare helper on two non-constant operands.
func TestSecretsComparedInConstantTime(t *testing.T) {
	if problems := constantTimeProblems(t, testenv.PackageSources(t)); len(problems) > 0 {
		t.Fatalf("constant-time rules broken:\n%s", strings.Join(problems, "\n"))
	}
}

// TestConstantTimeCheckerCatches proves the checker is not vacuous.
func TestConstantTimeCheckerCatches(t *testing.T) {
	good := `package auth
import s "crypto/subtle"
const v = 1
type Signer struct{}
func trafficTokenEqual(a string, b []byte) bool { return s.ConstantTimeCompare([]byte(a), b) == 1 }
func SameTrafficToken(a, b string) bool { return s.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }
func AdminAuthorized(a, b []byte) bool { return len(a) != 0 && s.ConstantTimeCompare(a, b) == v }
func (x *Signer) macValid(a, b []byte) bool { return s.ConstantTimeCompare(a, b) == 1 }
func CheckTraffic(a string, b []byte) error { if !trafficTokenEqual(a, b) { return nil }; return nil }
func PresentedTrafficToken() []byte { return nil }
func (x *Signer) Verify() {}
func (x *Signer) VerifyBytes(a, b []byte) bool { return x.macValid(a, b) }
func (x *Signer) VerifyCookie(a, b []byte) bool { return x.VerifyBytes(a, b) && s.ConstantTimeCompare(a, b) == 1 }
func (x *Signer) CookieValue() {}
func (x *Signer) binding() {}
`
	if p := constantTimeProblems(t, []string{good}); len(p) != 0 {
		t.Fatalf("good source flagged: %v", p)
	}
	bad := map[string][2]string{
		"bytes.Equal":       {"macValid(a, b []byte) bool { return s.ConstantTimeCompare(a, b) == 1 }", "macValid(a, b []byte) bool { return bytes.Equal(a, b) }"},
		"string ==":         {"return s.ConstantTimeCompare([]byte(a), b) == 1", "return a == string(b)"},
		"byte loop !=":      {"if !trafficTokenEqual(a, b) { return nil }", "if a[0] != b[0] { return nil }"},
		"not subtle":        {`import s "crypto/subtle"`, `import s "example.com/notsubtle"`},
		"caller bypasses":   {"return x.macValid(a, b)", "return true"},
		"compare func gone": {"func (x *Signer) macValid", "func (x *Signer) macOK"},
	}
	for name, r := range bad {
		src := strings.Replace(good, r[0], r[1], 1)
		if src == good {
			t.Fatalf("%s: replacement did not apply", name)
		}
		if p := constantTimeProblems(t, []string{src}); len(p) == 0 {
			t.Errorf("%s: checker found nothing", name)
		}
	}
}

func constantTimeProblems(t *testing.T, srcs []string) []string {
	t.Helper()
	fset := token.NewFileSet()
	funcs := map[string]*ast.FuncDecl{}
	subtleName := map[*ast.FuncDecl]string{}
	consts := map[string]bool{"nil": true, "true": true, "false": true}
	for i, src := range srcs {
		f, err := parser.ParseFile(fset, "src"+strconv.Itoa(i)+".go", src, 0)
		if err != nil {
			t.Fatal(err)
		}
		sub := ""
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == "crypto/subtle" {
				sub = "subtle"
				if imp.Name != nil {
					sub = imp.Name.Name
				}
			}
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				if d.Tok == token.CONST {
					for _, s := range d.Specs {
						for _, n := range s.(*ast.ValueSpec).Names {
							consts[n.Name] = true
						}
					}
				}
			case *ast.FuncDecl:
				funcs[funcKey(d)] = d
				subtleName[d] = sub
			}
		}
	}

	var problems []string
	for _, name := range secretCompareFuncs {
		fn := funcs[name]
		if fn == nil {
			problems = append(problems, name+": not found")
			continue
		}
		sub := subtleName[fn]
		if sub == "" || !calls(fn, func(c *ast.CallExpr) bool { return isSelector(c.Fun, sub, "ConstantTimeCompare") }) {
			problems = append(problems, name+": does not call crypto/subtle.ConstantTimeCompare")
		}
	}
	for caller, callee := range secretCallers {
		fn := funcs[caller]
		if fn == nil || !calls(fn, func(c *ast.CallExpr) bool { return calleeName(c.Fun) == callee }) {
			problems = append(problems, caller+": does not call "+callee)
		}
	}
	benign := func(e ast.Expr) bool {
		switch e := ast.Unparen(e).(type) {
		case *ast.BasicLit:
			return true
		case *ast.Ident:
			return consts[e.Name]
		case *ast.CallExpr:
			return calleeName(e.Fun) == "len" || calleeName(e.Fun) == "ConstantTimeCompare"
		}
		return false
	}
	for _, name := range secretHandlingFuncs {
		fn := funcs[name]
		if fn == nil {
			problems = append(problems, name+": not found")
			continue
		}
		ast.Inspect(fn, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BinaryExpr:
				if (n.Op == token.EQL || n.Op == token.NEQ) && !benign(n.X) && !benign(n.Y) {
					problems = append(problems, fset.Position(n.Pos()).String()+": "+name+" compares two variables with "+n.Op.String())
				}
			case *ast.CallExpr:
				switch calleeName(n.Fun) {
				case "Equal", "EqualFold", "Compare", "DeepEqual":
					problems = append(problems, fset.Position(n.Pos()).String()+": "+name+" calls a non-constant-time compare")
				}
			}
			return true
		})
	}
	return problems
}

func funcKey(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return d.Name.Name
	}
	typ := d.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + d.Name.Name
	}
	return d.Name.Name
}

func calls(fn *ast.FuncDecl, match func(*ast.CallExpr) bool) bool {
	found := false
	ast.Inspect(fn, func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok && match(c) {
			found = true
		}
		return !found
	})
	return found
}

// calleeName returns the called function's own name (f, pkg.F or x.m).
func calleeName(fun ast.Expr) string {
	switch f := fun.(type) {
	case *ast.Ident:
		return f.Name
	case *ast.SelectorExpr:
		return f.Sel.Name
	}
	return ""
}

func isSelector(fun ast.Expr, pkg, name string) bool {
	s, ok := fun.(*ast.SelectorExpr)
	if !ok || pkg == "" {
		return false
	}
	x, ok := s.X.(*ast.Ident)
	return ok && x.Name == pkg && s.Sel.Name == name
}

var sinkBool bool

// The two benchmarks differ only in where the wrong token first differs from
// the right one (byte 0 vs the last byte); with a constant-time compare their
// ns/op match. Compare with: go test -run ^$ -bench Compare ./auth
func BenchmarkCompareEarlyMismatch(b *testing.B) {
	benchmarkCompare(b, func(right []byte) { right[0] ^= 1 })
}

// BenchmarkCompareLateMismatch is BenchmarkCompareEarlyMismatch with the
// difference in the last byte.
func BenchmarkCompareLateMismatch(b *testing.B) {
	benchmarkCompare(b, func(right []byte) { right[len(right)-1] ^= 1 })
}

func benchmarkCompare(b *testing.B, spoil func([]byte)) {
	wrong := []byte(testToken)
	spoil(wrong)
	b.Run("traffic", func(b *testing.B) {
		for b.Loop() {
			sinkBool = trafficTokenEqual(testToken, wrong)
		}
	})
	b.Run("admin", func(b *testing.B) {
		configured := []byte(testToken)
		for b.Loop() {
			sinkBool = AdminAuthorized(configured, wrong)
		}
	})
	b.Run("signed", func(b *testing.B) {
		s := mustSigner(b, key1)
		tok := []byte(mustSign(b, s, "sbx", 80, testNow.Add(time.Minute)))
		// Spoil the MAC (the last 32 raw bytes) via its encoding.
		raw := make([]byte, 0, len(tok))
		raw, _ = s.enc.AppendDecode(raw, tok)
		spoil(raw[len(raw)-macLen:])
		bad := s.enc.AppendEncode(nil, raw)
		for b.Loop() {
			_, err := s.VerifyBytes(bad, "sbx", 80, testNow)
			sinkBool = err == nil
		}
	})
}
