// The same package from a CommonJS TypeScript file (`import = require`), type-checked only.
import mlx = require('mlx-bun')

export async function tokens(path: string): Promise<number[]> {
  const model: mlx.Model = await mlx.loadModel(path)
  const out: number[] = []
  for await (const t of mlx.generate(model, [1, 2, 3], { maxTokens: 4 })) out.push(t.token)
  return out
}
