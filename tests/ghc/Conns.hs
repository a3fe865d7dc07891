-- A server's memory in the shape of a pinned-fragmentation report: many connections,
-- each holding pinned ByteString buffers; when they close, the server keeps a tiny
-- slice of one connection in a hundred (a session id, say). `keep`: the slice shares its
-- buffer, so each survivor keeps a whole pinned block, and the block its megablock.
-- `copy`: the slice is copied out (Data.ByteString.copy), so the buffers can all go.
--
--   Conns CONNECTIONS keep|copy
{-# LANGUAGE BangPatterns #-}
import Control.Concurrent (threadDelay)
import Control.Exception (evaluate)
import Control.Monad (forM, forM_)
import qualified Data.ByteString as BS
import System.Environment (getArgs)
import System.IO (hFlush, stdout)
import System.Mem (performMajorGC)

-- Each connection reads into a few buffers of a few hundred bytes: small pinned byte
-- arrays, many to a block.
open :: Int -> IO [BS.ByteString]
open i = forM [1 .. 6] $ \j ->
  evaluate (BS.replicate (200 + (i * 37 + j * 101) `mod` 600) (fromIntegral (i + j)))

main :: IO ()
main = do
  [nStr, mode] <- getArgs
  let n = read nStr :: Int
  conns <- forM [1 .. n] open
  evaluate (sum (map (sum . map BS.length) conns)) >>= \total ->
    putStrLn ("open: " ++ show n ++ " connections, " ++ show total ++ " bytes")
  hFlush stdout
  performMajorGC
  threadDelay 1500000
  -- Close every connection, keeping 8 bytes of one in a hundred.
  let slice c = BS.take 8 (head c)
      keep = if mode == "copy" then BS.copy . slice else slice
  kept <- forM [c | (k, c) <- zip [0 :: Int ..] conns, k `mod` 100 == 0] (evaluate . keep)
  putStrLn ("closed: kept " ++ show (length kept) ++ " slices")
  hFlush stdout
  performMajorGC
  performMajorGC
  -- The plateau after the close: idle, as a server between bursts.
  forM_ [1 .. 30 :: Int] $ \_ -> threadDelay 100000
  print (sum (map BS.length kept))
