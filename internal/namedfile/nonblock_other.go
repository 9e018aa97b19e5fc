//go:build !unix

package namedfile

// noBlock is nothing where opening a file cannot block on a writer.
const noBlock = 0
